"""Long work on the event loop, in turns.

The loop that answers NRI hooks also runs the reconciler's passes, the QoS manager's rounds and
the inventory. A job whose size follows the node (a pass over every managed cgroup, a round
that reads every container) gives the loop back whenever it has held it for ``TURN`` seconds,
so a hook that arrives meanwhile waits for at most about one turn, whatever the node's size.
Turns are measured in time, not in items: a slow item (a cgroup read that stalls) shortens its
turn instead of stretching it.
"""

from __future__ import annotations

import time

# Seconds a job may hold the loop before it lets a waiting hook in. 0.25 ms: on a node of 3000
# containers a QoS round is some 150 turns; halving them from 0.5 ms took the hook p99 there
# from 583 to 473 us (in process, 6 runs each) for one more loop iteration per turn (~15 us).
TURN = 0.00025


class Turn:
    """One job's clock: ``over()`` says when to give the loop back; ``restart()`` when the
    job has it again."""

    __slots__ = ("budget", "started")

    def __init__(self, budget: float | None = None) -> None:
        self.budget = TURN if budget is None else budget
        self.started = time.perf_counter()

    def over(self) -> bool:
        return time.perf_counter() - self.started >= self.budget

    def restart(self) -> None:
        self.started = time.perf_counter()
