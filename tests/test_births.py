"""BE births (node/births.py): the listener is told when the first birth begins and the last
one ends, whatever the order; a birth that never reaches StartContainer ends after ``longest``;
the count stays bounded. And the hooks: CreateContainer of a BE container begins one,
StartContainer or RemoveContainer ends it, other classes begin none."""

from __future__ import annotations

from pathlib import Path

from nriplugin.node import births as births_mod
from nriplugin.node.births import Births
from testkit.hook_work import realistic_pod


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def followed(longest: float = 3.0) -> tuple[Births, Clock, list[bool]]:
    clock = Clock()
    b = Births(longest, clock)
    told: list[bool] = []
    b.subscribe(told.append)
    return b, clock, told


def test_first_begins_and_last_ends_are_told_once_each() -> None:
    b, clock, told = followed()
    b.begin("a")
    b.begin("b")
    assert told == [True] and b.open
    b.end("a")
    assert told == [True]
    clock.t += 0.5
    b.end("b")
    assert told == [True, False] and not b.open
    assert b.windows == 1 and b.open_seconds() == 0.5


def test_ending_what_never_began_tells_nothing() -> None:
    b, _, told = followed()
    b.end("x")
    b.begin("a")
    b.end("x")
    assert told == [True] and b.open


def test_a_birth_that_never_starts_ends_after_longest() -> None:
    b, clock, told = followed(longest=3.0)
    b.begin("failed")
    clock.t += 3.0
    b.expire()
    assert b.open  # not yet: at most ``longest``, not less
    clock.t += 0.01
    b.expire()
    assert told == [True, False] and not b.open and b.expired == 1


def test_an_old_birth_ends_when_a_new_one_begins() -> None:
    b, clock, told = followed(longest=3.0)
    b.begin("old")
    clock.t += 5.0
    b.begin("new")  # the old one expired: the window closed and opened again
    assert told == [True, False, True] and b.expired == 1
    b.end("new")
    assert not b.open and b.windows == 2


def test_the_births_followed_are_bounded() -> None:
    b, _, _ = followed()
    for i in range(births_mod.MOST + 10):
        b.begin(f"c{i}")
    assert len(b._since) == births_mod.MOST
    b.end("c0")  # long dropped
    assert b.open


def test_the_hooks_begin_and_end_be_births_only(tmp_path: Path) -> None:
    from tests.test_create_shapes import plugin

    p = plugin(tmp_path)
    told: list[bool] = []
    p.model.births.subscribe(told.append)
    ls_pod, ls = realistic_pod(1, "LS")
    p.create_container(ls_pod, ls)
    assert told == [] and not p.model.births.open
    be_pod, be = realistic_pod(2, "BE")
    other_pod, other = realistic_pod(3, "BE")  # the same shape: its answer is the memo's
    p.create_container(be_pod, be)
    p.create_container(other_pod, other)
    assert told == [True]
    p.start_container(be_pod, be)
    assert told == [True]
    p.remove_container(other_pod, other)  # failed to start: removed without StartContainer
    assert told == [True, False] and p.model.births.windows == 1
