"""The API server's answers as errors, sans-IO: an error answer (any status outside 2xx) becomes
an :class:`ApiError` carrying what its ``Status`` object said (reason, message, details and
their causes), or the HTTP reason phrase when the body was not a Status; a success whose body
is not the JSON object asked for is a :class:`BadAnswer`. Bytes in, an exception object out:
no session, no socket.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

BODY_KEPT = 4096  # characters of an error answer's body kept for the log (a Status is far smaller)


@dataclass(frozen=True)
class Cause:
    """One of a Status's ``details.causes``: which field, and what is wrong with it."""

    reason: str
    message: str
    field: str


class ApiError(Exception):
    """An error answer. ``reason`` and ``message`` are the Status's when the body was one
    (``is_status``), else the HTTP reason phrase and ""; ``body`` is the answer's text."""

    def __init__(
        self,
        status: int,
        phrase: str,
        *,
        reason: str = "",
        message: str = "",
        details: dict[str, Any] | None = None,
        is_status: bool = False,
        body: str = "",
        url: str = "",
    ) -> None:
        self.status = status
        self.phrase = phrase
        self.reason = reason or phrase
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.is_status = is_status
        self.body = body
        self.url = url
        super().__init__(f"{status} {self.reason}: {message}" if message else f"{status} {self.reason}".strip())

    @property
    def causes(self) -> list[Cause]:
        out = []
        for c in self.details.get("causes") or []:
            if isinstance(c, dict):
                out.append(Cause(str(c.get("reason") or ""), str(c.get("message") or ""), str(c.get("field") or "")))
        return out


class BadAnswer(ValueError):
    """A success whose body is not what was asked (not JSON, not an object): nothing in it is
    taken, and the request is as good as failed."""


@dataclass(frozen=True)
class StatusBody:
    """A ``kind: Status`` body, as far as an error needs it."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: object) -> StatusBody | None:
        if not isinstance(obj, dict) or obj.get("kind") != "Status":
            return None
        code = obj.get("code")
        details = obj.get("details")
        return cls(
            code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
            reason=str(obj.get("reason") or ""),
            message=str(obj.get("message") or ""),
            details=details if isinstance(details, dict) else {},
        )


def error_from(status: int, phrase: str, body: bytes, url: str = "") -> ApiError:
    """The error an answer with ``status`` (not 2xx) and ``body`` is."""
    text = body[:BODY_KEPT].decode("utf-8", "replace")
    try:
        obj: object = json.loads(body) if body else None
    except ValueError:
        obj = None
    parsed = StatusBody.parse(obj)
    if parsed is None:
        return ApiError(status, phrase, body=text, url=url)
    return ApiError(
        status,
        phrase,
        reason=parsed.reason,
        message=parsed.message,
        details=parsed.details,
        is_status=True,
        body=text,
        url=url,
    )


def error_from_status(obj: object, url: str = "") -> ApiError:
    """The error a watch's ERROR event carries (its object a Status, sent with a 200)."""
    parsed = StatusBody.parse(obj)
    if parsed is None:
        return ApiError(0, "", message=f"an ERROR event without a Status: {str(obj)[:200]}", url=url)
    return ApiError(
        parsed.code,
        "",
        reason=parsed.reason,
        message=parsed.message,
        details=parsed.details,
        is_status=True,
        body=json.dumps(obj)[:BODY_KEPT],
        url=url,
    )


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """A success's body as the JSON object it must be; BadAnswer if it is not one."""
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise BadAnswer(f"{what}: the answer is not JSON ({exc}): {body[:120]!r}") from None
    if not isinstance(obj, dict):
        raise BadAnswer(f"{what}: the answer is JSON but not an object: {body[:120]!r}")
    return obj
