"""What a caller asks the engine for, and what it gets back.

A :class:`Request` is a prompt already in the student's stream (the committed symbols and the
open bytes of its last word, which the engine feeds with the student placing the token ends, as
``generate`` does), a byte budget, sampling settings and stop strings. The engine reports to the
request's ``sink`` from its own thread: :class:`Event`\\ s holding the next bytes of the
continuation that can no longer be cut by a stop string, and a last one with the reason it
finished (``"stop"``: the end-of-document symbol, an end-of-turn symbol or a stop string;
``"length"``: the byte budget; ``"error"``: the step failed) and the bytes counted for usage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    """How a request chooses its symbols (greedy, or sampled with its own seed)."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Event:
    """New continuation bytes, and on the last event why the request finished and its byte counts."""

    data: bytes = b""
    finish_reason: str | None = None
    prompt_bytes: int = 0
    completion_bytes: int = 0
    error: str | None = None


@dataclass(eq=False)
class Request:
    symbols: list[int]  # the prompt's committed stream (<bos> first)
    open_bytes: bytes  # the prompt's last word: fed one byte at a time, the student placing the token ends
    max_new_bytes: int
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[bytes, ...] = ()
    sink: Callable[[Event], None] | None = None
    prompt_bytes: int = 0  # the prompt's text bytes, for usage
    max_symbols: int | None = None  # also stop after this many symbols (a token model's steps)
    replay: tuple[int, ...] = ()  # symbols its first steps must choose (measuring speed on real text)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Leave the batch at the next step boundary (or the queue), with no further event."""
        self.cancelled.set()


class Continuation:
    """A request's continuation bytes as they come: cut at the first stop string (which is left
    out), and released only once no stop string can still begin inside them."""

    def __init__(self, stop: tuple[bytes, ...]):
        self.stop = tuple(s for s in stop if s)
        self.data = bytearray()
        self.sent = 0
        self.stopped = False

    def add(self, byte: int) -> None:
        self.data.append(byte)
        for stop in self.stop:
            if self.data.endswith(stop):
                del self.data[len(self.data) - len(stop) :]
                self.stopped = True
                return

    def release(self, final: bool) -> bytes:
        """The bytes not yet released that no stop string can still claim (all of them when ``final``)."""
        end = len(self.data) if final or self.stopped else len(self.data) - self._held()
        chunk = bytes(self.data[self.sent : end])
        self.sent = max(self.sent, end)
        return chunk

    def _held(self) -> int:
        """The longest tail of the bytes that begins some stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self.data)), longest, -1):
                if self.data.endswith(stop[:size]):
                    longest = size
                    break
        return longest
