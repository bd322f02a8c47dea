"""Test-only address ranges, claimed across processes, and ip_forward kept as it was found.

The e2e runtimes with CNI and the emulated uplinks all live in 198.18.0.0/15's first two /24s
(RFC 2544 benchmarking space, never routed elsewhere): pod subnets are /27 slots of
198.18.0.0/24, uplinks /30 slots of 198.18.1.0/24. Several test processes (other worktrees, a
bench) can run at once on this machine, so a slot is claimed under a file lock, in a claim file
naming the owner's pid; a claim whose owner is dead, or a slot the kernel already routes, is
skipped. The bridge plugin turns on ``net.ipv4.ip_forward``; the value found before the first
live claim is kept and written back when the last claim is released, so one runtime's teardown
does not cut another's forwarding.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PODS = ipaddress.IPv4Network("198.18.0.0/24")
UPLINKS = ipaddress.IPv4Network("198.18.1.0/24")
STATE = Path("/tmp/nriplugin-netlab")
FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE.mkdir(mode=0o700, exist_ok=True)
    with open(STATE / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_claims() -> dict[str, ipaddress.IPv4Network]:
    """Live claims by name; stale claim files (owner dead) are removed."""
    out: dict[str, ipaddress.IPv4Network] = {}
    for f in STATE.glob("*.claim"):
        try:
            c = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(c["pid"])):
            out[f.stem] = ipaddress.IPv4Network(c["net"])
        else:
            f.unlink(missing_ok=True)
    return out


def _kernel_routes() -> list[ipaddress.IPv4Network]:
    r = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True, check=True)
    nets = []
    for line in r.stdout.splitlines():
        for dst in line.split()[:2]:  # "198.18.0.0/27 dev ..." or "local 127.0.0.1 dev ..."
            with contextlib.suppress(ValueError):
                net = ipaddress.IPv4Network(dst, strict=False)
                if net.prefixlen > 0:
                    nets.append(net)
                break
    return nets


def claim(name: str, pool: ipaddress.IPv4Network, prefix: int) -> ipaddress.IPv4Network:
    """Claim a free /``prefix`` of ``pool`` for ``name`` (a unique interface-safe name)."""
    with _locked():
        live = _live_claims()
        if name in live:
            raise ValueError(f"claim {name!r} already held")
        if not live:  # first holder: remember ip_forward as found
            (STATE / "forward").write_text(FORWARD.read_text().strip())
        used = [*live.values(), *_kernel_routes()]
        for net in pool.subnets(new_prefix=prefix):
            if not any(net.overlaps(u) for u in used):
                (STATE / f"{name}.claim").write_text(json.dumps({"pid": os.getpid(), "net": str(net)}))
                return net
    raise RuntimeError(f"no free /{prefix} left in {pool} (claims: {sorted(live)})")


def release(name: str) -> None:
    """Drop ``name``'s claim; the last live claim puts ip_forward back as it was found."""
    with _locked():
        (STATE / f"{name}.claim").unlink(missing_ok=True)
        if not _live_claims():
            saved = STATE / "forward"
            if saved.exists():
                FORWARD.write_text(saved.read_text().strip() + "\n")
                saved.unlink()


def held() -> bool:
    """Whether any claim is live (some runtime or uplink still needs ip_forward)."""
    with _locked():
        return bool(_live_claims())
