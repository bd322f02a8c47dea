"""Kernel access: every cgroup/resctrl name, path form, conversion and probe lives here, with
the roots injectable so tests point it at a temporary tree laid out like the kernel's."""
