"""Long work on the event loop, in turns.

The loop that answers NRI hooks also runs the reconciler's passes, the QoS manager's rounds and
the inventory. A job whose size follows the node (a pass over every managed cgroup, a round
that reads every container) gives the loop back whenever it has held it for ``TURN`` seconds,
or sooner when a hook request is waiting on a trunk (it looks every ``LOOK`` seconds), so a
hook that arrives meanwhile waits for about one item, whatever the node's size.
Turns are measured in time, not in items: a slow item (a cgroup read that stalls) shortens its
turn instead of stretching it.
"""

from __future__ import annotations

import time

from nriplugin.nri.transport import hook_waiting

# Seconds a job may hold the loop before it lets a waiting hook in. 0.25 ms: on a node of 3000
# containers a QoS round is some 150 turns; halving them from 0.5 ms took the hook p99 there
# from 583 to 473 us (in process, 6 runs each) for one more loop iteration per turn (~15 us).
TURN = 0.00025


# Seconds between two looks for a waiting hook request within a turn. A look is one poll(2)
# of the trunks (under 1 us); a request that arrives mid-turn waits for the item in progress
# and at most this long, not for the rest of the turn.
LOOK = 10e-6


class Turn:
    """One job's clock: ``over()`` says when to give the loop back — its turn is used up, or
    a hook request is waiting on a trunk; ``restart()`` when the job has it again."""

    __slots__ = ("budget", "looked", "started")

    def __init__(self, budget: float | None = None) -> None:
        self.budget = TURN if budget is None else budget
        self.started = self.looked = time.perf_counter()

    def over(self) -> bool:
        now = time.perf_counter()
        if now - self.started >= self.budget:
            return True
        if now - self.looked < LOOK:
            return False
        self.looked = now
        return hook_waiting()

    def restart(self) -> None:
        self.started = self.looked = time.perf_counter()
