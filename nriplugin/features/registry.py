"""Where feature modules register: each names its policy switch (``features.<name>``) and
registers its ``desired`` function with an order number, and ``nriplugin.features`` runs them
in that order.

The order is a dependency, not a preference: a later feature reads the values earlier ones
set. batchResource sizes BE's shares and quota from ``batch-cpu`` before cpuQOS gives BE the
lowest shares where batch left none; cpuBurst sizes the burst from the quota batch set.

Each declares the pod annotations and labels it reads (besides the QoS class, the container's
name and its requested resources): those, with the node's state, are all a new container's
values depend on, so CreateContainer answers containers of one shape from one computation
(``node/hooks.py``), and a test fails if a feature reads one it did not declare.

The names are the policy's (the fields of ``policy.model.Features``): a name the policy does
not have, or a second registration of one, fails at the registering module's import, and
:meth:`FeatureRegistry.pipeline` fails unless every switch the policy has registered a function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nriplugin.intent.core import Context, Intent
from nriplugin.policy.model import Features

Desired = Callable[[Context, Intent], None]


@dataclass(frozen=True, slots=True)
class Feature:
    name: str  # the policy's switch, ``features.<name>``
    order: int  # lower runs first
    desired: Desired
    annotations: tuple[str, ...] = ()  # the pod annotations it reads
    labels: tuple[str, ...] = ()  # the pod labels it reads


class FeatureRegistry:
    """The registered features, checked against the policy's switches."""

    def __init__(self, switches: Iterable[str]) -> None:
        self.switches = tuple(switches)
        self._by_name: dict[str, Feature] = {}

    def feature(
        self, name: str, order: int, annotations: tuple[str, ...] = (), labels: tuple[str, ...] = ()
    ) -> Callable[[Desired], Desired]:
        """A decorator registering ``desired`` as the feature ``name``, run at ``order``, reading
        the pod ``annotations`` and ``labels`` named."""

        def register(desired: Desired) -> Desired:
            if name not in self.switches:
                raise TypeError(f"{name!r} is not a feature switch of the policy ({', '.join(self.switches)})")
            if name in self._by_name:
                raise TypeError(f"feature {name!r} is registered twice")
            taken = [f.name for f in self._by_name.values() if f.order == order]
            if taken:
                raise TypeError(f"feature {name!r}: order {order} is {taken[0]}'s already (the order must be explicit)")
            self._by_name[name] = Feature(name, order, desired, annotations, labels)
            return desired

        return register

    def pipeline(self) -> tuple[Feature, ...]:
        """Every registered feature in order; an error unless each switch has its feature."""
        missing = [n for n in self.switches if n not in self._by_name]
        if missing:
            raise TypeError(f"no feature registered for the policy's switch(es): {', '.join(missing)}")
        return tuple(sorted(self._by_name.values(), key=lambda f: f.order))


REGISTRY = FeatureRegistry(Features.model_fields)
feature = REGISTRY.feature
