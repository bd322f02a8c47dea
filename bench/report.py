"""Writing a benchmark's section into BENCHMARKS.md, between its begin/end markers."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, section: str) -> None:
    """``section`` must start with ``<!-- NAME:begin -->`` and end with ``<!-- NAME:end -->``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert section.startswith(begin) and section.rstrip().endswith(end)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text:
        a = text.index(begin)
        b = text.index(end) + len(end) + 1
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


SCRATCH = ("--json", "--from-json")  # where a run's raw results went: a scratch file, not part of the recipe


def shown_command(prefix: str, argv: list[str]) -> str:
    """The command a section names: the run's arguments without the scratch files it saved its
    raw results to (a path on the measuring machine means nothing to a reader)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in SCRATCH:
            skip = True
            continue
        if a.split("=", 1)[0] in SCRATCH:
            continue
        out.append(a)
    return " ".join([prefix, *out])
