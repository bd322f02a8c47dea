"""A watch's answer, sans-IO: the API server streams one JSON object a line,
``{"type": ..., "object": ...}``, in chunks that split lines anywhere. ``WatchDecoder.feed``
takes the bytes as they come and returns the whole events they complete, in order; it keeps the
resourceVersion of the last event it returned (a BOOKMARK's too: it moves the resume point and
carries no change), from which a watch that ends is resumed.

An ERROR event carries a Status (``410 Gone``, ``Expired``: the history before that version was
compacted, everything must be listed again). A line that is not such an event, or one longer
than the bound, breaks the stream: the events before it are returned, ``broken`` says what was
wrong, and nothing after it is guessed at; the watch resumes from the last good version, so
nothing is lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nriplugin.cluster.status import ApiError, BadAnswer, error_from_status

LINE_BOUND = 32 << 20  # the longest event line taken (an object is at most etcd's 1.5 MiB, as JSON a few)
CHANGES = ("ADDED", "MODIFIED", "DELETED")
BOOKMARK = "BOOKMARK"
ERROR = "ERROR"


@dataclass(frozen=True)
class WatchEvent:
    """One event: ``type`` is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR; ``object`` the
    object as JSON (a Status for ERROR); ``error`` the Status as an ApiError for ERROR."""

    type: str
    object: dict[str, Any]
    resource_version: str
    error: ApiError | None = None

    @property
    def is_change(self) -> bool:
        return self.type in CHANGES


class WatchDecoder:
    def __init__(self, resource_version: str = "", line_bound: int = LINE_BOUND) -> None:
        self.resource_version = resource_version  # of the last event returned
        self.line_bound = line_bound
        self.events = 0  # events returned
        self.broken: BadAnswer | None = None  # set at the first line that is not an event; feed stops
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of a line not complete yet (a stream that ends with some cut an event short)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[WatchEvent]:
        """The events ``data`` completes. Once ``broken`` is set, nothing more."""
        out: list[WatchEvent] = []
        if self.broken is not None:
            return out
        start = len(self._buf)
        self._buf += data
        while True:
            nl = self._buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            start = 0
            if not line.strip():
                continue
            try:
                out.append(self._event(line))
            except BadAnswer as exc:
                self.broken = exc
                self._buf.clear()
                return out
        if len(self._buf) > self.line_bound:
            self.broken = BadAnswer(f"a watch event longer than {self.line_bound} bytes")
            self._buf.clear()
        return out

    def _event(self, line: bytes) -> WatchEvent:
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise BadAnswer(f"a watch event that is not JSON ({exc}): {line[:120]!r}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("type"), str) or not isinstance(doc.get("object"), dict):
            raise BadAnswer(f"a watch event without a type and an object: {line[:120]!r}")
        kind, obj = doc["type"], doc["object"]
        if kind == ERROR:
            self.events += 1
            return WatchEvent(ERROR, obj, self.resource_version, error_from_status(obj))
        if kind not in CHANGES and kind != BOOKMARK:
            raise BadAnswer(f"a watch event of an unknown type {kind!r}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if rv is not None and not isinstance(rv, str):
            raise BadAnswer(f"a {kind} event whose resourceVersion is not a string: {rv!r}")
        if rv:
            self.resource_version = rv
        self.events += 1
        return WatchEvent(kind, obj, self.resource_version)
