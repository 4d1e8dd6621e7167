"""A server-sent events decoder (the parsing rules of the HTML living standard, §9.2.6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ServerSentEvent:
    event: str
    data: str
    id: Optional[str] = None


class SSEDecoder:
    """Feed it lines (without their line terminator); it returns an event on each blank line
    that ends one. `last_event_id` and `retry_ms` persist across events, as in a browser."""

    def __init__(self) -> None:
        self.last_event_id: Optional[str] = None
        self.retry_ms: Optional[int] = None
        self._event = ""
        self._data: list[str] = []
        self._id: Optional[str] = None

    def feed(self, line: str) -> Optional[ServerSentEvent]:
        if line == "":
            if not self._data and not self._event:
                self._id = None
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data), self._id)
            if self._id is not None:
                self.last_event_id = self._id
            self._event, self._data, self._id = "", [], None
            return event
        if line.startswith(":"):  # a comment: keepalive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
                self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None
