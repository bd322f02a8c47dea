"""The observer of a component nobody watches (tests, tools, a part built without metrics):
every report is dropped. Components declare the observer protocol they call; this answers
any of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _drop(*args: Any, **kwargs: Any) -> None:
    return None


class Unobserved:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return _drop
