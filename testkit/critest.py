"""cri-tools' ``critest`` (the CRI validation suite) against the private containerd, once with
nriplugin registered on the runtime's NRI socket and once without, spec by spec.

An NRI plugin sits inside every pod and container call of the runtime; the suite is the
runtime's own yardstick for those calls, so the agent must leave its verdict unchanged. Each
run gets a fresh containerd (testkit/containerd.py, NRI on, a CNI bridge so pods have a network
of their own) and the test images critest asks for, built here from Debian's busybox under the
names it expects. Its pulls go to a registry on 127.0.0.1 that serves those images
(testkit/registry.py) and nowhere else. critest talks to the runtime through a CRI proxy that
gives each pod the cgroup parent kubelet would (testkit/cri_proxy.py): the agent then manages
critest's pods as a node's, instead of passing over pods it cannot place. Specs that need what
cannot be made here, or what this harness does not give, are skipped with a reason
(:data:`SKIPS`); the rest run.

    python -m testkit.critest --binary CRITEST [--focus REGEX] [--out DIR]

The binary is built (cached) by ``bash kind/build.sh critest``; ``scripts/critest.sh`` does both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit import containerd as harness
from testkit import images
from testkit.cri_proxy import CRIProxy
from testkit.plugin import PluginProcess, runtime_args, scrape
from testkit.registry import Registry, split_name

ROOT = Path(__file__).resolve().parent.parent
VERSION = "1.37.0"  # kind/lib.sh's CRI_TOOLS_VERSION

# The images critest names (pkg/framework and pkg/validate of cri-tools v1.37.0).
E2E = "registry.k8s.io/e2e-test-images/"
STAGING = "gcr.io/k8s-staging-cri-tools/"
BUSYBOX = E2E + "busybox:1.29-2"
NGINX = E2E + "nginx:1.14-2"
HTTPD = E2E + "httpd:2.4.39-4"
NONEWPRIVS = E2E + "nonewprivs:1.3"
HOSTNET_NGINX = STAGING + "hostnet-nginx-amd64:latest"
PREDEFINED_GROUP = STAGING + "test-image-predefined-group:latest"
PAUSE_39 = ("registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9")  # one image in two registries
# The image specs' own images (pkg/validate/consts.go), served by the local registry only: those
# specs pull and remove them. One image per name but where critest wants one image under more.
USER_IMAGES = {"uid": "1002", "username": "www-data", "uid-group": "1003:1003", "username-group": "www-data:www-data"}

# What cannot run here: a ginkgo --skip pattern (matched against a spec's full text) and why.
SKIPS: tuple[tuple[str, str], ...] = (
    (
        r"public image with digest should be pulled",
        "names its image by the digest of the image published upstream, which cannot be made here",
    ),
    (
        r"port mapping",
        "host ports need the CNI portmap plugin and iptables rules; the harness's bridge network has neither",
    ),
    (r"\[k8s\.io\] AppArmor", "the harness's containerd runs with AppArmor disabled (as cri-tools' own CI skips it)"),
    (
        r"runtime should support MaskedPaths",
        "the stand-in busybox (Debian's static one) runs `ls` inside its shell, so a masked /bin/ls is never executed",
    ),
    (
        r"NRI plugin synchronization should receive (a callback for container created during|information about all)",
        "containerd does not give what they look for: critest skips them itself (spec discrepancy), after 18 s each",
    ),
)
SKIP_NO_GCC = (r"NoNewPrivs", "its image's set-uid program is compiled here, and there is no gcc with a static libc")

# States of a spec in ginkgo's JSON report that mean it ran to an end.
RAN = ("passed", "failed", "panicked", "timedout", "interrupted", "aborted")

PASSWD = """\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
GROUP = """\
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
tty:x:5:
www-data:x:33:
operator:x:37:
users:x:100:
nogroup:x:65534:
"""

# busybox-static lacks these two; critest's specs call them in the default image.
PGREP = """\
#!/bin/sh
# A stand-in for procps' `pgrep NAME`: the pids whose command is NAME (exit 1 if none).
found=1
for d in /proc/[0-9]*; do
  if [ "$(cat "$d/comm" 2>/dev/null)" = "$1" ]; then echo "${d#/proc/}"; found=0; fi
done
exit $found
"""
IPCS = """\
#!/bin/sh
# A stand-in for util-linux's `ipcs -m`: this IPC namespace's shared memory segments.
echo "------ Shared Memory Segments --------"
echo "key shmid perms bytes"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size rest; do echo "$key $shmid $perms $size"; done
"""
NNP_C = '#include <stdio.h>\n#include <unistd.h>\nint main(void) { printf("Effective uid: %d\\n", (int)geteuid()); }\n'
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INDEX = b"<html><body>a test page</body></html>\n"


def busybox_root(busybox: Path, extra: dict[str, tuple[bytes, int]] | None = None) -> bytes:
    """A layer like the busybox image's: every applet the binary has, as a hard link (critest
    masks /bin/ls and expects the shell to live on), the stand-ins above, busybox's users and
    groups."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    files = {
        "bin/busybox": (busybox.read_bytes(), 0o755),
        "bin/pgrep": (PGREP.encode(), 0o755),
        "bin/ipcs": (IPCS.encode(), 0o755),
        "etc/passwd": (PASSWD.encode(), 0o644),
        "etc/group": (GROUP.encode(), 0o644),
        **(extra or {}),
    }
    links = {f"bin/{a}": "bin/busybox" for a in applets if f"bin/{a}" not in files and a != "busybox"}
    dirs = ("dev", "proc", "sys", "tmp", "var/run", "var/www", "run", "root", "home", "usr/sbin")
    return images.tree_layer(files, dirs=dirs, hardlinks=links)


def nonewprivs_program(work: Path) -> Path | None:
    """The nonewprivs image's program: set-uid root, it says its effective uid. None without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    src, out = work / "nnp.c", work / "nnp"
    src.write_text(NNP_C)
    r = subprocess.run([gcc, "-static", "-O2", "-o", str(out), str(src)], capture_output=True, timeout=120)
    return out if r.returncode == 0 else None


def build_images(busybox: Path, work: Path) -> tuple[dict[str, Path], dict[str, list[str]], list[tuple[str, str]]]:
    """The test images as OCI archives: those the runtime gets before critest runs (name ->
    archive), those only the registry serves (archive's name -> more names for the same image),
    and the skips for what cannot be made here. The web servers are busybox's httpd; the nginx
    one runs as a process named ``nginx`` whose command line says ``master process`` and writes
    /var/run/nginx.pid, as critest's namespace specs look for."""
    work.mkdir(parents=True, exist_ok=True)
    index = (INDEX, 0o644)
    present: dict[str, Path] = {}
    served: dict[str, list[str]] = {}
    skips: list[tuple[str, str]] = []

    def archive(name: str, layer: bytes, cmd: list[str], user: str = "") -> Path:
        path = work / (name.rsplit("/", 1)[1].replace(":", "_") + ".tar")
        return images.oci_archive_layers([layer], name, [], path, cmd=cmd, path=IMAGE_PATH, user=user)

    def image(name: str, layer: bytes, cmd: list[str], user: str = "", also: tuple[str, ...] = ()) -> None:
        present[name] = archive(name, layer, cmd, user)
        served[name] = list(also)

    def pulled(name: str, also: tuple[str, ...] = (), user: str = "") -> None:
        # its own file, as upstream's test images have (ADD ${TEST}): a distinct image per name
        mark = name.rsplit("/", 1)[1].replace(":", "-")
        archive(name, busybox_root(busybox, {mark: (mark.encode() + b"\n", 0o644)}), ["sh"], user)
        served[name] = list(also)

    image(BUSYBOX, busybox_root(busybox), ["sh"])
    # The runtime's sandbox image, in place of the harness's (busybox's sleep): critest's pods
    # share one PID namespace, and a spec asks that no process named sleep be left in it.
    pause = ["sh", "-c", "exec -a busybox /pause sleep 2147483647"]
    image(images.PAUSE, busybox_root(busybox, {"pause": (busybox.read_bytes(), 0o755)}), pause)
    nginx = (
        'echo $$ > /var/run/nginx.pid; exec -a "busybox nginx: master process nginx -g daemon off;" '
        "/usr/sbin/nginx httpd -f -p {port} -h /usr/share/nginx/html"
    )
    nginx_files = {"usr/sbin/nginx": (busybox.read_bytes(), 0o755), "usr/share/nginx/html/index.html": index}
    image(NGINX, busybox_root(busybox, nginx_files), ["sh", "-c", nginx.format(port=80)])
    image(HOSTNET_NGINX, busybox_root(busybox, nginx_files), ["sh", "-c", nginx.format(port=12003)])
    httpd = "echo 'httpd: serving on port 80'; exec httpd -f -p 80 -h /usr/local/apache2/htdocs"
    image(HTTPD, busybox_root(busybox, {"usr/local/apache2/htdocs/index.html": index}), ["sh", "-c", httpd])
    group = GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"
    predefined = {
        "etc/passwd": ((PASSWD + "default-user:x:1000:1000::/home/default-user:/bin/sh\n").encode(), 0o644),
        "etc/group": (group.encode(), 0o644),
    }
    image(PREDEFINED_GROUP, busybox_root(busybox, predefined), ["sh"], user="1000")
    nnp = nonewprivs_program(work)
    if nnp is None:
        skips.append(SKIP_NO_GCC)
    else:
        layer = busybox_root(busybox, {"usr/local/bin/nnp": (nnp.read_bytes(), 0o4755)})
        image(NONEWPRIVS, layer, ["/usr/local/bin/nnp"])
    for name in ("test-image-tag:test", "test-image-tag:all", "test-image-latest:latest"):
        pulled(STAGING + name)
    for n in (1, 2, 3):
        pulled(f"{STAGING}test-image-{n}:latest")
    pulled(STAGING + "test-image-tags:1", also=(STAGING + "test-image-tags:2", STAGING + "test-image-tags:3"))
    for kind, user in USER_IMAGES.items():
        pulled(f"{STAGING}test-image-user-{kind}:latest", user=user)
    pulled(PAUSE_39[0], also=PAUSE_39[1:])
    return present, served, skips


def import_images(rt: harness.Containerd, archives: dict[str, Path]) -> None:
    for path in archives.values():
        rt.ctr("images", "import", str(path))


@dataclass
class Outcome:
    """One critest run: each spec's state by its full text, and what it took."""

    states: dict[str, str]
    seconds: float
    failures: dict[str, str] = field(default_factory=dict)  # spec -> ginkgo's failure message
    agent: dict[str, float] | None = None  # the agent's counters after the run (with it only)
    segments: set[str] = field(default_factory=set)  # host shared memory segments it made (removed)
    placed: int = 0  # pods that got kubelet's cgroup parent on the way (testkit/cri_proxy.py)

    def count(self) -> Counter[str]:
        return Counter(self.states.values())

    def ran(self) -> dict[str, str]:
        return {k: v for k, v in self.states.items() if v in RAN}

    def summary(self) -> str:
        c = self.count()
        return ", ".join(f"{n} {s}" for s, n in sorted(c.items())) + f" in {self.seconds:.0f} s"


def parse_report(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Ginkgo's JSON report: the It specs' states and failure messages, by full text."""
    states: dict[str, str] = {}
    failures: dict[str, str] = {}
    for suite in json.loads(path.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]])
            states[name] = spec["State"]
            if spec["State"] not in ("passed", "skipped", "pending"):
                failures[name] = (spec.get("Failure") or {}).get("Message", "")[:2000]
    return states, failures


def critest_command(
    binary: Path, rt: harness.Containerd, endpoint: str, report: Path, skips: list[tuple[str, str]]
) -> list[str]:
    cmd = [
        str(binary),
        f"-runtime-endpoint={endpoint}",
        f"-image-endpoint={endpoint}",
        f"-nri-socket={rt.nri_socket}",
        f"-ginkgo.json-report={report}",
        "-ginkgo.no-color",
        "-ginkgo.timeout=30m",
    ]
    cmd += [f"-ginkgo.skip={pattern}" for pattern, _ in skips]
    return cmd


def ipcmk_wrapper(folder: Path, record: Path) -> None:
    """An ``ipcmk`` first in critest's PATH that writes down the segment it made: critest's
    host-IPC specs make one each on the host and never remove it; we do, by id."""
    folder.mkdir(parents=True, exist_ok=True)
    real = shutil.which("ipcmk") or "/usr/bin/ipcmk"
    script = folder / "ipcmk"
    script.write_text(
        "#!/bin/sh\n"
        f'out=$({real} "$@") || exit $?\n'
        'echo "$out"\n'
        f'echo "$out" | sed -n "s/^Shared memory id: //p" >>{record}\n'
    )
    script.chmod(0o755)


def remove_segments(record: Path) -> set[str]:
    """Remove the segments ``record`` names; return their ids."""
    ids = set(record.read_text().split()) if record.exists() else set()
    for shmid in ids:
        subprocess.run(["ipcrm", "-m", shmid], capture_output=True, check=False)
    return ids


def kubelet_parent(rt: harness.Containerd, config: Any) -> str:
    """Where kubelet (cgroupfs driver) puts a pod that asks for nothing: BestEffort's group, under
    the runtime's kubepods, which the agent's ``--pods-root`` names."""
    uid = config.metadata.uid or str(uuid.uuid4())
    return f"/{rt.cgroup_root}/kubepods/besteffort/pod{uid}"


def default_cgroups() -> dict[Path, set[str]]:
    """containerd's own cgroup for the containers of a pod that names no cgroup parent (as
    critest's pods on the cgroupfs driver): ``/k8s.io/<id>`` in every hierarchy where it is,
    with the children it has now."""
    return {
        h / "k8s.io": {c.name for c in (h / "k8s.io").iterdir() if c.is_dir()}
        for h in harness.CGROUP_FS.iterdir()
        if (h / "k8s.io").is_dir()
    }


def remove_default_cgroups(before: dict[Path, set[str]]) -> None:
    """What appeared under /k8s.io since ``before`` (the runtime leaves the folder itself), and
    the folder if it was not there: rmdir only, so a group with a process in it stays and shows."""
    for top, children in default_cgroups().items():
        for name in children - before.get(top, set()):
            with contextlib.suppress(OSError):
                (top / name).rmdir()
        if top not in before:
            with contextlib.suppress(OSError):
                top.rmdir()


def run_once(
    binary: Path,
    pkg_root: Path,
    archives: dict[str, Path],
    skips: list[tuple[str, str]],
    agent: bool,
    out_dir: Path,
    registry: Registry,
    timeout: float = 1800,
    focus: str = "",
) -> Outcome:
    """critest against a fresh containerd that pulls from ``registry`` alone, with the agent
    registered (its default policy) or not, and critest's own NRI plugin on the same socket
    for its NRI specs; everything it made is gone when this returns."""
    label = "with-agent" if agent else "without-agent"
    base = Path(tempfile.mkdtemp(prefix="nriplugin-critest-"))
    rt = harness.Containerd(pkg_root, base, nri=True, cni=True)
    images_plugin = "io.containerd.cri.v1.images" if rt.runtime.config_version == 3 else "io.containerd.grpc.v1.cri"
    rt.extra_config = f'\n[plugins."{images_plugin}".registry]\n  config_path = "{base / "certs.d"}"\n'
    registry.write_hosts(base / "certs.d", {"registry.k8s.io", "gcr.io", "k8s.gcr.io"})
    plugin: PluginProcess | None = None
    proc: subprocess.Popen[bytes] | None = None
    proxy: CRIProxy | None = None
    outcome: Outcome | None = None
    record = base / "ipcmk.ids"
    report = out_dir / f"{label}.json"
    log_path = out_dir / f"{label}.log"
    cgroups_before = default_cgroups()
    try:
        rt.start()
        import_images(rt, archives)  # first: the sandbox image is ours, the harness's is not imported
        rt.import_images()
        if agent:
            plugin = PluginProcess(rt.nri_socket, *runtime_args(rt))
            plugin.wait_ready()
        (base / "tmp").mkdir()
        ipcmk_wrapper(base / "path", record)
        env = {
            **os.environ,
            "TMPDIR": str(base / "tmp"),
            "PATH": f"{base / 'path'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        }
        proxy = CRIProxy(rt.address, base / "cri-proxy.sock", lambda cfg: kubelet_parent(rt, cfg))
        proxy.start()
        cmd = critest_command(binary, rt, proxy.address, report, skips)
        if focus:
            cmd.append(f"-ginkgo.focus={focus}")
        report.unlink(missing_ok=True)
        t0 = time.monotonic()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=base, env=env, start_new_session=True
            )
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: critest and what it ran
                proc.wait()
                raise RuntimeError(
                    f"critest ({label}) did not finish in {timeout:.0f} s; its log: {log_path}"
                ) from None
        seconds = time.monotonic() - t0
        if not report.exists():
            raise RuntimeError(f"critest ({label}) wrote no report (exit {proc.returncode}); its log: {log_path}")
        states, failures = parse_report(report)
        counters = None
        if plugin is not None:
            if plugin.proc.poll() is not None:
                raise RuntimeError(f"the agent exited during critest ({label}): {plugin.logs()[-3000:]}")
            counters = {
                "create_container_hooks": scrape(
                    plugin.port, 'nriplugin_hook_duration_seconds_count{event="create_container"}'
                ),
                "run_pod_sandbox_hooks": scrape(
                    plugin.port, 'nriplugin_hook_duration_seconds_count{event="run_pod_sandbox"}'
                ),
                "hook_failures": plugin.metric_sum("nriplugin_hook_failures_total"),
                "registrations": plugin.metric("nriplugin_registrations_total"),
                "repaired": plugin.metric_sum("nriplugin_repaired_total"),
                "write_errors": plugin.metric_sum("nriplugin_write_errors_total"),
                "conflicts": plugin.metric_sum("nriplugin_conflicts_total"),
            }
            (out_dir / f"{label}.agent.log").write_text(plugin.logs())
        outcome = Outcome(states, seconds, failures, counters, placed=proxy.placed)
        return outcome
    finally:
        if proc is not None:  # critest's session: itself and anything it started and left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:
            if proxy is not None:
                proxy.stop()
            if plugin is not None:
                plugin.stop()
        finally:
            segments = remove_segments(record)
            if outcome is not None:
                outcome.segments = segments
            try:
                rt.teardown()
            finally:
                remove_default_cgroups(cgroups_before)


def compare(
    binary: Path, pkg_root: Path, out_dir: Path, focus: str = "", timeout: float = 1800
) -> tuple[Outcome, Outcome, list[tuple[str, str]]]:
    """critest without the agent, then with it; the skips used (pattern, why)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    present, served, image_skips = build_images(pkg_root / "bin" / "busybox", out_dir / "images")
    skips = [*SKIPS, *image_skips]
    reg = Registry()
    for path in sorted((out_dir / "images").glob("*.tar")):
        reg.add_archive(path)
    for name, also in served.items():
        for more in also:
            reg.tags[split_name(more)] = reg.tags[split_name(name)]
    reg.start()
    try:
        without = run_once(binary, pkg_root, present, skips, False, out_dir, reg, timeout, focus)
        with_agent = run_once(binary, pkg_root, present, skips, True, out_dir, reg, timeout, focus)
    finally:
        reg.stop()
    return without, with_agent, skips


def differences(a: Outcome, b: Outcome) -> list[str]:
    """The specs whose state differs between two runs, each with both states."""
    names = sorted(set(a.states) | set(b.states))
    return [
        f"{n}: {a.states.get(n, 'absent')} -> {b.states.get(n, 'absent')}"
        for n in names
        if a.states.get(n) != b.states.get(n)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", type=Path, required=True, help="critest (bash kind/build.sh critest)")
    ap.add_argument("--focus", default="", help="a ginkgo focus regex (default: every spec not skipped)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "critest", help="reports, logs and images")
    args = ap.parse_args(argv)
    pkg_root = harness.install()
    without, with_agent, skips = compare(args.binary, pkg_root, args.out, args.focus)
    print(f"critest v{VERSION} on containerd {harness.runtime_of(pkg_root).version}")
    print("skipped here:")
    for pattern, why in skips:
        print(f"  {pattern}: {why}")
    for label, o in (("without the agent", without), ("with the agent", with_agent)):
        print(f"{label}: {o.summary()}")
        for name, msg in sorted(o.failures.items()):
            print(f"  failed: {name}\n    {msg.splitlines()[0] if msg else ''}")
    if with_agent.agent:
        print("agent: " + ", ".join(f"{k} {v:.0f}" for k, v in with_agent.agent.items()))
    print(f"pods given kubelet's cgroup parent: {without.placed} without the agent, {with_agent.placed} with it")
    diff = differences(without, with_agent)
    print("specs that ran:")
    for name, state in sorted(without.ran().items()):
        print(f"  {state:8} {name}")
    if diff:
        print("DIFFERENT with the agent:")
        for d in diff:
            print(f"  {d}")
        return 1
    print(f"the same result with and without the agent ({len(without.ran())} specs ran); reports in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
