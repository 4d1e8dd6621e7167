"""From the event loop to a worker thread: a request body read ahead in ~1 MiB blocks.

An upload's parsing and validation (api.uploads.receive_upload) is blocking work, in a thread;
the bytes arrive in the event loop. BodyPump joins them into blocks and hands them over through
a small queue, so receiving overlaps parsing and memory stays bounded, and it enforces the
upload's idle timeout: a client that sends nothing for `idle_timeout` seconds gets a 408.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Self

from api.uploads import CHUNK, UploadRejected

_END = object()


class BodyPump:
    """Reads a request body in the event loop, ahead of a worker thread that consumes it.

    Body chunks are joined into blocks of ~1 MiB (one thread hand-over per block, not per
    64 KiB socket read) and queued, at most `depth` blocks ahead: memory stays bounded and
    receiving overlaps the consumer's work. `chunks()` is the consumer's (blocking) iterator;
    an error while receiving (client gone, body over the size limit, no byte for
    `idle_timeout` seconds: UploadRejected(408)) is raised there. Use as an async context
    manager: leaving it stops the reader.

    `await first_block()` waits, in the event loop, until there is something for a consumer:
    a first block, the end of the body, or an error (raised there). A slow client therefore
    holds no thread until it has sent a block or all of its body."""

    def __init__(
        self, stream, *, block: int = CHUNK, depth: int = 4, idle_timeout: float | None = None
    ):
        self.stream = stream
        self.block = block
        self.idle_timeout = idle_timeout
        self.queue: asyncio.Queue = asyncio.Queue(depth)
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task | None = None
        self._first: Any = None

    async def __aenter__(self) -> Self:
        self.task = asyncio.ensure_future(self._read())
        return self

    async def __aexit__(self, *exc_info) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.wait([self.task])
        while not self.queue.empty():  # unblock a consumer still waiting (never normally)
            self.queue.get_nowait()
        self.queue.put_nowait(UploadRejected(400, "the upload was abandoned"))

    async def _read(self) -> None:
        parts: list[bytes] = []
        size = 0
        body = aiter(self.stream)
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        chunk = await anext(body)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise UploadRejected(
                        408,
                        f"no byte of the upload arrived for {self.idle_timeout:g} s "
                        "(UPLOAD_IDLE_TIMEOUT_S); nothing of it was kept",
                    ) from None
                parts.append(chunk)
                size += len(chunk)
                if size >= self.block:
                    await self.queue.put(b"".join(parts))
                    parts, size = [], 0
            if parts:
                await self.queue.put(b"".join(parts))
            await self.queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            await self.queue.put(exc)

    async def first_block(self) -> None:
        """Wait for the first block (or the end, or an error: raised here)."""
        if self._first is None:
            self._first = await self.queue.get()
        if isinstance(self._first, BaseException):
            raise self._first

    def chunks(self) -> Iterator[bytes]:
        """The body's blocks, in a worker thread (blocks while the next one arrives)."""
        while True:
            if self._first is not None:
                item, self._first = self._first, None
            else:
                item = asyncio.run_coroutine_threadsafe(self.queue.get(), self.loop).result()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
