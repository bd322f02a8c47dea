"""A plugin on nriplugin's own NRI stack that does no work: every CreateContainer gets the same
fixed adjustment. What it costs the runtime is what the Python stack itself costs (the loop,
the multiplexer, ttrpc, protobuf, the socket) before any of nriplugin's work: the floor under
nriplugin's figures in bench/hook_latency.py.

Usage: .venv/bin/python -m bench.stub_floor --socket PATH
"""

from __future__ import annotations

import argparse
import asyncio

from nriplugin.nri import api_pb2 as api
from nriplugin.nri.stub import Plugin, Stub, StubOptions
from nriplugin.pacing.selector import PollClock
from nriplugin.pacing.traffic import HookTraffic


class Fixed(Plugin):
    def __init__(self) -> None:
        self.adjustment = api.ContainerAdjustment()
        self.adjustment.linux.resources.cpu.shares.value = 2

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        return self.adjustment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    args = ap.parse_args()
    poll = PollClock()

    async def serve() -> None:
        await Stub(
            Fixed(),
            StubOptions(socket_path=args.socket, backoff_initial=0.01, traffic=HookTraffic(poll)),
        ).run()

    with asyncio.Runner(loop_factory=poll.loop) as runner:
        runner.run(serve())


if __name__ == "__main__":
    main()
