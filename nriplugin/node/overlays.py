"""Overlays: decisions layered over the features' desired state (a suppressed BE quota, a
granted burst), keyed by container, pod (``pod:<id>``) or QoS-level group (``group:<path>``).

Each decision has an owner (``qos:cpuSuppress``) and a reason. The desired state merges them
over the features' values, so the hook, UpdateContainers pushes, the reconciler's repairs and
``explain`` all see one result; the reconciler keeps an overlay's value as it keeps a
feature's. Owners are applied in the order they first set a key, so a later owner wins a
resource two owners set.
"""

from __future__ import annotations

from dataclasses import dataclass

from nriplugin.kernel.cgroup import RESOURCES

GROUP_PREFIX = "group:"
NET_RESOURCES = frozenset(f"net.{lv}.{d}Ceil" for lv in ("L0", "L1", "L2") for d in ("ingress", "egress"))


def group_key(path: str) -> str:
    """The key of a QoS-level cgroup (e.g. the BE parent), by its relative path."""
    return GROUP_PREFIX + path.strip("/")


@dataclass(frozen=True, slots=True)
class OverlayDecision:
    owner: str
    values: tuple[tuple[str, int | str], ...]  # (resource, value)
    reason: str


class Overlays:
    def __init__(self) -> None:
        self._by_key: dict[str, dict[str, OverlayDecision]] = {}  # key -> owner -> decision

    def set(self, key: str, owner: str, values: dict[str, int | str], reason: str) -> bool:
        """Set ``owner``'s decision on ``key`` (replacing its previous one); returns whether
        anything changed. Unknown resources are refused: a decision is applied, never guessed."""
        if not owner or not values:
            raise ValueError("an overlay needs an owner and at least one value")
        for resource, value in values.items():
            if resource in NET_RESOURCES:  # a network class ceiling (bits/s), see features/net_qos.py
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ValueError(f"overlay {owner}: {resource} must be a positive number of bits/s")
                continue
            res = RESOURCES.get(resource)
            if res is None:
                raise ValueError(f"overlay {owner}: unknown resource {resource!r}")
            res.check(value)
        d = OverlayDecision(owner, tuple(sorted(values.items())), reason)
        have = self._by_key.setdefault(key, {})
        if have.get(owner) == d:
            return False
        have[owner] = d
        return True

    def withdraw(self, key: str, owner: str) -> bool:
        have = self._by_key.get(key)
        if have is None or have.pop(owner, None) is None:
            return False
        if not have:
            del self._by_key[key]
        return True

    def forget(self, key: str) -> None:
        """The object is gone: its decisions go with it."""
        self._by_key.pop(key, None)

    def __contains__(self, key: object) -> bool:
        """Whether any decision stands on ``key``."""
        return bool(self._by_key.get(key))  # type: ignore[call-overload]

    def of(self, key: str) -> list[OverlayDecision]:
        return list(self._by_key.get(key, {}).values())

    def targets(self, owner: str | None = None) -> list[str]:
        return [k for k, d in self._by_key.items() if owner is None or owner in d]
