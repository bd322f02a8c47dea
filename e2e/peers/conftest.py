"""The koordlet lane (``pytest -m koordlet``, ``bash scripts/koordlet.sh``): Koordinator's node
agent run beside nriplugin as a benchmark peer on a host-process Kubernetes node
(testkit/hostnode.py). It needs Kubernetes' binaries (``bash kind/build.sh tools``) and
koordlet (``bash testkit/peers/koordlet.sh``, 5 minutes of cgo compiling the first time), so
it is not in CI: the cold build would take CI past its budget. Unless the ``-m`` expression
names it, its tests are skipped with that reason, never silently dropped."""

from __future__ import annotations

import pytest

LANE = "the koordlet lane: bash scripts/koordlet.sh (pytest -m koordlet); not in CI (README, 'The koordlet lane')"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = "koordlet" in (config.getoption("-m", default="") or "")
    for item in items:
        if "/e2e/peers/" in str(item.fspath):
            item.add_marker(pytest.mark.koordlet)
            if not chosen:
                item.add_marker(pytest.mark.skip(reason=LANE))
