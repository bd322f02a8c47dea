"""``nriplugin top``: the QoS manager live, from the agent's ``/debug/qos`` (qos/view.py).

A separate process polling the agent, like ``doctor --agent``: it needs no privilege and
works through a port forward. Drawn with rich (``Live`` in the terminal's alternate screen)
rather than escape codes by hand; only this module imports rich, and only ``nriplugin top``
imports this module, so the agent's start-up never pays for it.
"""

from __future__ import annotations

import io
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

LEVEL_STYLE = {
    "LOW": "green",
    "MEDIUM": "yellow",
    "HIGH": "dark_orange",
    "CRITICAL": "bold red",
    "EMERGENCY": "bold white on red",
}


class Unreachable(Exception):
    """The agent did not answer with a QoS document; the message is the one line to print."""


def fetch(address: str, timeout: float = 2.0) -> dict[str, Any]:
    url = f"http://{address}/debug/qos"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        if exc.code == 404:
            detail = "no /debug/qos here (an older agent, or not nriplugin's metrics address)"
        raise Unreachable(f"{url}: HTTP {exc.code}: {detail}") from None
    except (OSError, ValueError) as exc:  # refused, timed out, bad address
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{url}: {reason}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        raise Unreachable(f"{url}: not JSON") from None
    if not isinstance(doc, dict):
        raise Unreachable(f"{url}: not a QoS document")
    return doc


def _level(name: Any) -> Text:
    name = str(name or "-")
    return Text(name, style=LEVEL_STYLE.get(name, ""))


def _score(s: dict[str, Any]) -> Text:
    score = s.get("score")
    return Text("    -  " if score is None else f"{float(score):5.1f}  ") + _level(s.get("level"))


def _cores(x: Any) -> str:
    return "-" if x is None else f"{float(x):.2f}"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.0f}%"


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"  # unreachable; keeps mypy sure of a return


def _bar(used: Any, of: Any, width: int = 20) -> Text:
    """usage / limit as a bar; red once at the limit."""
    if used is None or not of:
        return Text("")
    frac = max(0.0, float(used) / float(of))
    filled = min(width, round(frac * width))
    style = "red" if frac >= 0.95 else "yellow" if frac >= 0.75 else "green"
    return Text("█" * filled, style=style) + Text("·" * (width - filled), style="dim")


def render(doc: dict[str, Any], address: str = "", error: str | None = None) -> RenderableType:
    """One frame: the scores and the node, the classes, the bursts, the last decisions.
    ``error``: the last poll failed; the previous document is shown under it."""
    state = "on" if doc.get("enabled") else "OFF (overlays withdrawn)"
    title = f"nriplugin top  {address}  ·  QoS manager {state}  ·  profile {doc.get('profile', '-')}"
    parts: list[RenderableType] = []
    if error is not None:
        parts.append(Text(f"agent unreachable, retrying: {error}", style="bold red"))
    parts += [_head(doc), _classes(doc), _bursting(doc), _decisions(doc)]
    return Panel(Group(*parts), title=title, title_align="left", box=box.ROUNDED)


def _head(doc: dict[str, Any]) -> Table:
    """Scores and level on the left; BE's limit and the node's CPU and memory on the right."""
    cpu, mem = doc.get("cpu") or {}, doc.get("memory") or {}
    node = doc.get("node")
    head = Table.grid(padding=(0, 3))
    head.add_column(justify="right", style="bold")
    head.add_column()
    head.add_column(justify="right", style="bold")
    head.add_column()
    be_limit = doc.get("beLimitCores")
    head.add_row(
        "CPU score",
        _score(cpu),
        "BE limit",
        "not limited" if be_limit is None else f"{be_limit:.2f} cores  (ratio {doc.get('suppressRatio', 0):g})",
    )
    if node is not None:
        busy = f"{_cores(node.get('busyCores'))} / {node.get('ncpu')} cores busy  (load {node.get('load1')})"
        avail = f"{_bytes(node.get('memAvailableBytes'))} free of {_bytes(node.get('memTotalBytes'))}"
    else:
        busy = avail = "no sample yet (the agent has just started)"
    head.add_row("memory score", _score(mem), "node CPU", busy)
    head.add_row("level", _level(doc.get("level")), "node memory", avail)
    return head


CLASS_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("class", "left"),
    ("ctrs", "right"),
    ("usage", "right"),
    ("request", "right"),
    ("limit", "right"),
    ("usage / limit", "left"),
    ("throttled", "right"),
    ("memory", "right"),
)


def _classes(doc: dict[str, Any]) -> Table:
    """One row per class: usage against request and limit, throttling, memory."""
    classes = Table(box=box.SIMPLE_HEAD, expand=True, title="classes", title_justify="left")
    for col, just in CLASS_COLUMNS:
        classes.add_column(col, justify=just)
    be_limit = doc.get("beLimitCores")
    for c in doc.get("classes") or []:
        limit = c.get("limitCores")
        if c.get("class") == "BE" and be_limit is not None:
            limit = be_limit if limit is None else min(limit, be_limit)  # the QoS group's quota caps them all
        classes.add_row(
            c.get("class", "?"),
            str(c.get("containers", 0)),
            _cores(c.get("usageCores")),
            _cores(c.get("requestCores")),
            _cores(limit) if limit is not None else "none" if c.get("containers") else "-",
            _bar(c.get("usageCores"), limit),
            _pct(c.get("throttledRatio")),
            _bytes(c.get("memoryBytes")),
        )
    if not doc.get("classes"):
        classes.add_row("-", "", "", "", "", Text("no sample yet", style="dim"), "", "")
    return classes


def _bursting(doc: dict[str, Any]) -> RenderableType:
    """The LS containers bursting now, with their quota's multiple; one dim line when none."""
    bursts = doc.get("bursting") or []
    if not bursts:
        return Text("bursting: none", style="dim")
    burst = Table(box=box.SIMPLE_HEAD, expand=True, title=f"bursting ({len(bursts)})", title_justify="left")
    burst.add_column("container")
    burst.add_column("quota x", justify="right")
    for b in bursts:
        burst.add_row(str(b.get("container")), f"{b.get('ratio', 1):g}")
    return burst


def _decisions(doc: dict[str, Any]) -> Table:
    """The manager's last decisions, newest first; a long reason wraps in its column."""
    decs = doc.get("decisions") or []
    dec = Table(box=box.SIMPLE_HEAD, expand=True, title="last decisions (newest first)", title_justify="left")
    dec.add_column("ago", justify="right", no_wrap=True)
    dec.add_column("owner", no_wrap=True)
    dec.add_column("target", overflow="fold", max_width=40)
    dec.add_column("value", no_wrap=True)
    dec.add_column("why", ratio=1)
    for d in decs:
        dec.add_row(
            f"{d.get('ageSeconds', 0):.1f}s",
            str(d.get("owner")),
            str(d.get("target")),
            str(d.get("value")),
            str(d.get("why", "")),
        )
    if not decs:
        dec.add_row("", Text("none yet", style="dim"), "", "", "")
    return dec


def natural_width(frame: RenderableType) -> int:
    """The width ``frame`` takes with no line wrapped (a long reason on one line)."""
    return Console(width=10_000, file=io.StringIO()).measure(frame).maximum


def run(
    address: str,
    interval: float = 1.0,
    once: bool = False,
    console: Console | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """0 on Ctrl-C (or after one frame with ``once``: at its natural width when not a terminal);
    2 with one line when the agent is not there at the start. Once running, a failed poll keeps
    the last frame with the error on top (an agent restart should not end the view)."""
    console = console or Console()
    try:
        doc = fetch(address)
    except Unreachable as exc:
        print(f"nriplugin top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    if once:
        frame = render(doc, address)
        if not console.is_terminal:  # piped or to a file: nothing to fit, so nothing wraps
            console.width = natural_width(frame)
        console.print(frame)
        return 0
    try:
        with Live(render(doc, address), console=console, screen=True, auto_refresh=False) as live:
            while True:
                sleep(interval)
                try:
                    doc, error = fetch(address), None
                except Unreachable as exc:
                    error = str(exc)
                live.update(render(doc, address, error), refresh=True)
    except KeyboardInterrupt:
        return 0
