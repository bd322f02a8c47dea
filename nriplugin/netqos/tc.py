"""Linux tc through netlink (pyroute2): the node's shared HTB trees, each pod's leaf and
filters, and the redirects on the pods' host-side veths. Nothing else is touched: only our
own IFB devices (``<prefix>-egress``, ``<prefix>-ingress``) and the veths the caller names.

Layout (per pod direction, one IFB each)::

  pod egress : host veth clsact ingress --u32 all, mirred--> IFB <prefix>-egress
  pod ingress: host veth clsact egress  --u32 all, mirred--> IFB <prefix>-ingress
  IFB: htb 1: ─ 1:1 (rate = ceil = node total)
                 ├ 1:10 L0 (prio 0) ├ 1:11 L1 (prio 1) └ 1:12 L2 (prio 2)   rate = request, ceil = limit
                 └ per pod leaf 1:<minor> under its level, its own queue; u32 on the pod's IP
                   (source in the egress IFB, destination in the ingress IFB) picks the leaf.

The IFB classifies by IP because a redirect keeps no class: setting ``skb->priority`` needs
``act_skbedit``, which kernels built without it (such as this project's CI machine) lack;
u32, mirred, HTB and clsact are the pieces required (:func:`probe` says which exist). Each
pod's leaf has its own queue, so a bulk flow queues behind itself, never in front of another
pod's packets; fq_codel is that queue where the kernel has it, else a short pfifo.

:meth:`TC.sync` makes the kernel match a :class:`TcPlan` (read, compare, change only what
differs) and returns what it changed: the reconciler's drift and repairs.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nriplugin.netqos.desired import DIRECTIONS, NetLevel, NodeNet, Rates

log = logging.getLogger("nriplugin.tc")

ROOT = 0x10000  # htb 1:
TOP = 0x10001  # 1:1, the node total
LEVEL_MINOR = 0x10  # 1:10 + level
FIRST_LEAF = 0x100
LAST_LEAF = 0xFFFE
TC_H_ROOT = 0xFFFFFFFF
HOOK = {"egress": 0xFFFFFFF2, "ingress": 0xFFFFFFF3}  # pod direction -> clsact hook of its host veth
REDIRECT_PRIO = 0xC0DE  # our filters' priorities on a veth's clsact hooks, one per pod direction
REDIRECT_PRIOS = {"egress": REDIRECT_PRIO, "ingress": REDIRECT_PRIO + 1}
ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
MTU = 1600
PFIFO_LIMIT = 128  # packets: a short queue per pod where fq_codel is missing
IP_OFFSET = {"egress": 12, "ingress": 16}  # source / destination address in the IPv4 header


REQUIRED = ("ifb", "htb", "clsact", "u32", "mirred")  # the pieces without which nothing is shaped


def ifb_names(prefix: str) -> dict[str, str]:
    """Our IFB device per pod direction."""
    return {d: f"{prefix}-{d}" for d in ("egress", "ingress")}


def missing(caps: dict[str, bool]) -> list[str]:
    """The required pieces a probe did not find."""
    return [k for k in REQUIRED if not caps.get(k)]


def leaf_handle(minor: int) -> int:
    return ROOT | minor


def level_handle(level: NetLevel) -> int:
    return ROOT | (LEVEL_MINOR + int(level))


@dataclass(frozen=True, slots=True)
class PodPlan:
    """One pod's shaping: its host veth (ifindex), IPv4 address, leaf minor and level, and
    its leaf rates by pod direction."""

    pod: str
    veth: int
    ip: str
    minor: int
    level: NetLevel
    rates: tuple[tuple[str, Rates], ...]

    def rate(self, direction: str) -> Rates:
        return dict(self.rates)[direction]


@dataclass(frozen=True, slots=True)
class TcPlan:
    node: NodeNet
    pods: tuple[PodPlan, ...] = ()


@dataclass
class Snapshot:
    """What the trees hold: per (direction, class minor) the bytes sent; per direction which
    leaf minors exist; IFBs present."""

    ifbs: dict[str, bool] = field(default_factory=dict)
    bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    drops: dict[tuple[str, int], int] = field(default_factory=dict)


class TCError(OSError):
    """A netlink request the kernel refused."""


def _bps(bits: int) -> str:
    return f"{bits}bit"


def _burst(bits: int) -> int:
    """Bytes an HTB class may send at once: 1 ms at its rate plus a packet, as tc(8) computes
    with HZ=1000. pyroute2 0.9 takes the kernel's clock rate (1e9) for HZ and leaves one MTU,
    which gates a slow flow's 1 ms bursts and holds LS packets behind them."""
    return bits // 8 // 1000 + MTU


def _attr(msg: Any, name: str, default: Any = None) -> Any:
    return msg.get_attr(name, default)


class TC:
    """One netlink connection to the namespace whose pods we shape (None: the agent's own).
    Blocking: use it from one worker thread."""

    def __init__(self, netns: str | None = None, prefix: str = "nrq", fq_codel: bool | None = None) -> None:
        from nriplugin.netqos.netns import iproute

        self.netns = netns
        self.prefix = prefix
        self.ifb = ifb_names(prefix)
        self.ipr = iproute(netns)
        self._fq_codel = fq_codel

    def close(self) -> None:
        self.ipr.close()

    # probing -------------------------------------------------------------------------------------

    def probe(self) -> dict[str, bool]:
        """Which tc pieces the kernel has, tried on a throwaway IFB of ours."""
        name = f"{self.prefix}-probe"
        out = {"ifb": False, "htb": False, "clsact": False, "u32": False, "mirred": False, "fq_codel": False}
        self._del_link(name)
        try:
            self.ipr.link("add", ifname=name, kind="ifb")
        except Exception:
            return out
        out["ifb"] = True
        try:
            idx = self._index(name)
            assert idx is not None
            out["htb"] = self._try(lambda: self.ipr.tc("add", "htb", idx, ROOT, default=0))
            if out["htb"]:
                out["htb"] = self._try(lambda: self.ipr.tc("add-class", "htb", idx, TOP, parent=ROOT, rate="1mbit"))
                out["fq_codel"] = self._try(lambda: self.ipr.tc("add", "fq_codel", idx, 0x20000, parent=TOP))
                out["u32"] = self._try(
                    lambda: self.ipr.tc(
                        "add-filter", "u32", idx, parent=ROOT, prio=1, protocol=ETH_P_IP, target=TOP, keys=["0x0/0x0+0"]
                    )
                )
            out["clsact"] = self._try(lambda: self.ipr.tc("add", "clsact", idx))
            if out["clsact"]:
                out["mirred"] = self._try(lambda: self._redirect_filter(idx, "egress", idx))
        finally:
            self._del_link(name)
        if self._fq_codel is None:
            self._fq_codel = out["fq_codel"]
        return out

    @staticmethod
    def _try(fn: Any) -> bool:
        try:
            fn()
        except Exception:
            return False
        return True

    # links -----------------------------------------------------------------------------------------

    def _index(self, name: str) -> int | None:
        found = self.ipr.link_lookup(ifname=name)
        return int(found[0]) if found else None

    def _del_link(self, name: str) -> bool:
        idx = self._index(name)
        if idx is None:
            return False
        try:
            self.ipr.link("del", index=idx)
        except Exception as exc:
            if getattr(exc, "code", 0) != errno.ENODEV:
                raise
        return True

    def link_exists(self, ifindex: int) -> bool:
        try:
            return bool(self.ipr.get_links(ifindex))
        except Exception:
            return False

    def _ensure_ifb(self, name: str, changes: list[str]) -> int:
        idx = self._index(name)
        if idx is None:
            self.ipr.link("add", ifname=name, kind="ifb")
            idx = self._index(name)
            changes.append(f"link {name}")
        assert idx is not None
        link = self.ipr.get_links(idx)[0]
        if not link["flags"] & 1:  # IFF_UP
            self.ipr.link("set", index=idx, state="up")
            if f"link {name}" not in changes:
                changes.append(f"link {name} up")
        return idx

    # the veth side -----------------------------------------------------------------------------

    def veth_owner(self, ifindex: int) -> str:
        """Who shapes this host veth: "" nobody, "nriplugin" us, else what another put there
        (the bandwidth CNI plugin's tbf root or ingress qdisc, say). "gone": no such link."""
        if not self.link_exists(ifindex):
            return "gone"
        for q in self.ipr.get_qdiscs(ifindex):
            kind = _attr(q, "TCA_KIND")
            if kind == "clsact":
                for hook in HOOK.values():
                    for f in self._filters(ifindex, hook):
                        if _prio(f) not in REDIRECT_PRIOS.values():
                            return f"a clsact filter (prio {f['prio']})"
                continue
            if q["handle"] != 0 and kind not in ("noqueue",):
                return f"a {kind} qdisc"
            if kind == "ingress":
                return "an ingress qdisc"
        for hook in HOOK.values():
            if any(_prio(f) in REDIRECT_PRIOS.values() for f in self._filters(ifindex, hook)):
                return "nriplugin"
        return ""

    def _filters(self, ifindex: int, parent: int) -> list[Any]:
        try:
            return [f for f in self.ipr.get_filters(index=ifindex, parent=parent) if _attr(f, "TCA_KIND")]
        except Exception:
            return []

    def _redirect_filter(self, veth: int, direction: str, ifb: int) -> None:
        self.ipr.tc(
            "add-filter",
            "u32",
            veth,
            parent=HOOK[direction],
            prio=REDIRECT_PRIOS[direction],
            protocol=ETH_P_ALL,
            target=TOP,
            keys=["0x0/0x0+0"],
            action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb},
        )

    def _redirect_ok(self, veth: int, direction: str, ifb: int) -> bool:
        for f in self._filters(veth, HOOK[direction]):
            if _prio(f) != REDIRECT_PRIOS[direction]:
                continue
            if str(ifb) in _mirred_targets(f):
                return True
        return False

    def _ensure_redirect(self, pod: PodPlan, direction: str, ifb: int, changes: list[str]) -> None:
        if self._redirect_ok(pod.veth, direction, ifb):
            return
        if not any(_attr(q, "TCA_KIND") == "clsact" for q in self.ipr.get_qdiscs(pod.veth)):
            self.ipr.tc("add", "clsact", pod.veth)
        self._del_filter(pod.veth, HOOK[direction], REDIRECT_PRIOS[direction], ETH_P_ALL)
        self._redirect_filter(pod.veth, direction, ifb)
        changes.append(f"redirect {pod.pod} {direction}")

    def release(self, veth: int) -> bool:
        """Take our redirects (and the clsact qdisc, which only we put there) off a veth."""
        if not self.link_exists(veth):
            return False
        if self.veth_owner(veth) != "nriplugin":
            return False
        try:
            self.ipr.tc("del", "clsact", veth)
        except Exception as exc:
            log.debug("veth %d: %s", veth, exc)
            return False
        return True

    # the IFB side ------------------------------------------------------------------------------

    def _del_filter(self, ifindex: int, parent: int, prio: int, protocol: int = ETH_P_IP) -> None:
        try:
            # tcm_info carries (prio, protocol); without a kind pyroute2 does not fill it, and
            # prio 0 would delete every filter of the parent.
            info = (prio << 16) | socket.htons(protocol)
            self.ipr.tc("del-filter", None, ifindex, parent=parent, info=info)
        except Exception as exc:
            if getattr(exc, "code", 0) not in (errno.ENOENT, errno.EINVAL):
                log.debug("del filter prio %d on %d: %s", prio, ifindex, exc)

    def _classes(self, ifb: int) -> dict[int, Any]:
        return {int(c["handle"]): c for c in self.ipr.get_classes(ifb) if _attr(c, "TCA_KIND") == "htb"}

    def _leaf_qdiscs(self, ifb: int) -> dict[int, str]:
        return {int(q["parent"]): str(_attr(q, "TCA_KIND")) for q in self.ipr.get_qdiscs(ifb)}

    def _ensure_root(self, ifb: int, changes: list[str], name: str) -> None:
        for q in self.ipr.get_qdiscs(ifb):
            if q["parent"] == TC_H_ROOT and _attr(q, "TCA_KIND") == "htb" and q["handle"] == ROOT:
                return
        self.ipr.tc("replace", "htb", ifb, ROOT, default=0)
        changes.append(f"qdisc {name} htb")

    def _ensure_class(
        self,
        ifb: int,
        have: dict[int, Any],
        handle: int,
        parent: int,
        r: Rates,
        prio: int,
        changes: list[str],
        name: str,
    ) -> bool:
        """Returns whether the class was (re)created (its queue must be added again)."""
        cur = have.get(handle)
        kw = {
            "parent": parent,
            "rate": _bps(r.rate),
            "ceil": _bps(r.ceil),
            "prio": prio,
            "burst": _burst(r.rate),
            "cburst": _burst(r.ceil),
        }
        if cur is not None and int(cur["parent"]) != (TC_H_ROOT if parent == ROOT else parent):
            self._drop_class(ifb, handle)
            cur = None
        if cur is None:
            self.ipr.tc("add-class", "htb", ifb, handle, **kw)
            changes.append(f"class {name} {handle >> 16:x}:{handle & 0xFFFF:x}")
            return True
        if _htb_params(cur) != (r.rate // 8, r.ceil // 8, prio):
            self.ipr.tc("change-class", "htb", ifb, handle, **kw)
            changes.append(f"class {name} {handle >> 16:x}:{handle & 0xFFFF:x} rates")
        return False

    def _drop_class(self, ifb: int, handle: int) -> None:
        self._del_filter(ifb, ROOT, handle & 0xFFFF)
        try:
            self.ipr.tc("del-class", None, ifb, handle)
        except Exception as exc:
            if getattr(exc, "code", 0) != errno.ENOENT:
                raise

    def _leaf_queue(self, ifb: int, handle: int) -> None:
        major = (handle & 0xFFFF) << 16
        if self._fq_codel:
            self.ipr.tc("add", "fq_codel", ifb, major, parent=handle)
        else:
            self.ipr.tc("add", "pfifo", ifb, major, parent=handle, limit=PFIFO_LIMIT)

    def _ensure_filter(self, ifb: int, pod: PodPlan, direction: str, have: dict[int, Any], changes: list[str]) -> None:
        key = _ip_key(pod.ip, direction)
        cur = have.get(pod.minor)
        if cur is not None and _u32_match(cur) == (key, leaf_handle(pod.minor)):
            return
        self._del_filter(ifb, ROOT, pod.minor)
        self.ipr.tc(
            "add-filter",
            "u32",
            ifb,
            parent=ROOT,
            prio=pod.minor,
            protocol=ETH_P_IP,
            target=leaf_handle(pod.minor),
            keys=[key],
        )
        changes.append(f"filter {pod.pod} {direction}")

    def _ifb_filters(self, ifb: int) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for f in self._filters(ifb, ROOT):
            if _attr(f, "TCA_OPTIONS") is not None and _u32_match(f) is not None:
                out[_prio(f)] = f
            else:
                out.setdefault(_prio(f), f)
        return out

    # the whole -------------------------------------------------------------------------------------

    def sync(self, plan: TcPlan) -> list[str]:
        """Make the kernel match ``plan``; returns what had to change (empty: it matched).
        Pods whose veth is gone are skipped (their rules went with it)."""
        changes: list[str] = []
        pods = [p for p in plan.pods if self.link_exists(p.veth)]
        for d in DIRECTIONS:
            name = self.ifb[d]
            if not pods:
                if self._del_link(name):
                    changes.append(f"link {name} removed")
                continue
            ifb = self._ensure_ifb(name, changes)
            self._ensure_root(ifb, changes, name)
            have = self._classes(ifb)
            self._ensure_class(ifb, have, TOP, ROOT, Rates(plan.node.total, plan.node.total), 0, changes, name)
            for level in NetLevel:
                r = plan.node.rates(level, d)
                self._ensure_class(ifb, have, level_handle(level), TOP, r, int(level), changes, name)
            wanted = {p.minor for p in pods}
            for handle in sorted(have):
                minor = handle & 0xFFFF
                if handle >> 16 == 1 and FIRST_LEAF <= minor <= LAST_LEAF and minor not in wanted:
                    self._drop_class(ifb, handle)
                    changes.append(f"class {name} 1:{minor:x} removed")
            queues = self._leaf_qdiscs(ifb)
            for p in pods:
                h = leaf_handle(p.minor)
                made = self._ensure_class(ifb, have, h, level_handle(p.level), p.rate(d), int(p.level), changes, name)
                if made or h not in queues:
                    self._leaf_queue(ifb, h)
                    if not made:
                        changes.append(f"qdisc {name} 1:{p.minor:x}")
            filters = self._ifb_filters(ifb)
            for prio in filters:
                if FIRST_LEAF <= prio <= LAST_LEAF and prio not in wanted:
                    self._del_filter(ifb, ROOT, prio)
                    changes.append(f"filter {name} prio {prio} removed")
            for p in pods:
                self._ensure_filter(ifb, p, d, filters, changes)
                self._ensure_redirect(p, d, ifb, changes)
        return changes

    def veths(self) -> list[tuple[int, str, str]]:
        """Host-side veths whose peer lives in another namespace (a pod's interface, for the
        usual CNIs): (ifindex, name, who shapes it: see :meth:`veth_owner`)."""
        out = []
        for link in self.ipr.get_links():
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
            if kind == "veth" and link.get_attr("IFLA_LINK_NETNSID") is not None:
                idx = int(link["index"])
                out.append((idx, str(link.get_attr("IFLA_IFNAME")), self.veth_owner(idx)))
        return out

    def snapshot(self) -> Snapshot:
        s = Snapshot()
        for d in DIRECTIONS:
            idx = self._index(self.ifb[d])
            s.ifbs[d] = idx is not None
            if idx is None:
                continue
            for handle, c in self._classes(idx).items():
                st = _attr(c, "TCA_STATS2")
                basic = st.get_attr("TCA_STATS_BASIC") if st is not None else None
                queue = st.get_attr("TCA_STATS_QUEUE") if st is not None else None
                if basic is not None:
                    s.bytes[(d, handle & 0xFFFF)] = int(basic["bytes"])
                if queue is not None:
                    s.drops[(d, handle & 0xFFFF)] = int(queue["drops"])
        return s

    def remove_all(self, veths: Iterable[int] = ()) -> list[str]:
        """Everything of ours: redirects on ``veths``, then the IFBs."""
        out = [f"redirect {v} removed" for v in veths if self.release(v)]
        out += [f"link {n} removed" for n in self.ifb.values() if self._del_link(n)]
        return out


def _prio(f: Any) -> int:
    """A filter's priority (the upper half of tcm_info; the lower is its protocol)."""
    return (int(f["info"]) >> 16) & 0xFFFF


def _ip_key(ip: str, direction: str) -> str:
    addr = ipaddress.IPv4Address(ip)
    return f"0x{int(addr):08x}/0xffffffff+{IP_OFFSET[direction]}"


def _u32_match(f: Any) -> tuple[str, int] | None:
    """A u32 filter's one key ("0xVAL/0xMASK+OFF", as ``_ip_key`` writes it) and classid.
    The selector is read from its raw bytes: pyroute2 0.9 decodes ``tc_u32_sel`` with a
    header 4 bytes too long (its keys come out shifted)."""
    opts = _attr(f, "TCA_OPTIONS")
    if opts is None:
        return None
    sel = opts.get_attr("TCA_U32_SEL")
    cid = opts.get_attr("TCA_U32_CLASSID")
    if sel is None or cid is None:
        return None
    raw = bytes(sel.data[sel.offset + 4 : sel.offset + sel.length])  # past the NLA header
    if len(raw) < 16 + 16 or raw[2] != 1:  # struct tc_u32_sel (16 bytes), nkeys at [2]; one key
        return None
    mask, val = struct.unpack("!II", raw[16:24])  # __be32 mask, value; int off, offmask
    off = struct.unpack("=i", raw[24:28])[0]
    return f"0x{val:08x}/0x{mask:08x}+{off}", int(cid)


def _mirred_targets(f: Any) -> list[str]:
    opts = _attr(f, "TCA_OPTIONS")
    if opts is None:
        return []
    out = []
    acts = opts.get_attr("TCA_U32_ACT")
    for a in (acts.get("attrs") if acts is not None else None) or []:
        val = a[1]
        if getattr(val, "get_attr", None) is None or val.get_attr("TCA_ACT_KIND") != "mirred":
            continue
        parms = val.get_nested("TCA_ACT_OPTIONS", "TCA_MIRRED_PARMS")
        if parms is not None:
            out.append(str(parms["ifindex"]))
    return out


def _htb_params(c: Any) -> tuple[int, int, int]:
    opts = _attr(c, "TCA_OPTIONS")
    p = opts.get_attr("TCA_HTB_PARMS")
    rate = opts.get_attr("TCA_HTB_RATE64") or p["rate"]
    ceil = opts.get_attr("TCA_HTB_CEIL64") or p["ceil"]
    return int(rate), int(ceil), int(p["prio"])


__all__ = ["DIRECTIONS", "TC", "PodPlan", "Rates", "Snapshot", "TCError", "TcPlan", "leaf_handle", "level_handle"]
