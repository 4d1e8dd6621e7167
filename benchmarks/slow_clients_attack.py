"""Team A's side of benchmarks/slow_clients.py: 200 uploads sent at one byte a second, or
2,000 event-stream attempts, over raw HTTP/1.1 connections, in a process of its own.

Team A's client work does not share an event loop (nor a GIL) with team B's load generator,
whose latencies would otherwise include it. `start_team_a(kind, ...)` starts the process and
returns it with its end of a pipe; the protocol is in `_uploads` and `_streams`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from typing import Any

from openloop import percentile

SLOW_UPLOADS = 200
STREAM_ATTEMPTS = 2000
TIMEOUT_S = 10.0
BOUNDARY = "benchslowclient"
CONTENT = "".join(
    json.dumps({"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": "no"}) + "\n"
    for i in range(4)
).encode()


# --- raw slow clients -------------------------------------------------------------------------


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status, headers = await read_head(reader)
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


class SlowUpload:
    """POST /v1/files whose body goes out at one byte a second; `finish()` sends the rest."""

    def __init__(self, port: int, key: str):
        self.port, self.key = port, key
        self.body = (
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\ntrain\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"slow.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
        ).encode() + CONTENT + f"\r\n--{BOUNDARY}--\r\n".encode()  # fmt: skip
        self.sent = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(
            (
                f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Bearer {self.key}\r\n"
                f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                f"Content-Length: {len(self.body)}\r\n\r\n"
            ).encode()
        )
        await self.writer.drain()

    async def trickle(self, stop: asyncio.Event) -> None:
        """One byte a second until `stop` (never the last bytes of the body)."""
        while not stop.is_set() and self.sent < len(self.body) - 1:
            self.writer.write(self.body[self.sent : self.sent + 1])
            self.sent += 1
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass

    async def finish(self) -> str:
        """'201', or what came instead (an early answer, 408 or 429, is read here too)."""
        try:
            self.writer.write(self.body[self.sent :])
            async with asyncio.timeout(TIMEOUT_S):
                status, _, body = await read_response(self.reader)
            return str(status) if status == 201 else f"{status} {body[:200]!r}"
        except Exception as exc:  # noqa: BLE001 - counted as an error
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.writer.close()


async def open_stream(port: int, key: str, job_id: str) -> tuple[str, float, Any]:
    """('200' and the open writer) or (the status / error, None) of one stream attempt."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /v1/jobs/{job_id}/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        async with asyncio.timeout(TIMEOUT_S):
            status, headers = await read_head(reader)
        took = time.perf_counter() - start
        if status == 200:
            return "200", took, writer
        writer.close()
        if status == 429 and not headers.get("retry-after", "").isdigit():
            return "429 without Retry-After", took, None
        return str(status), took, None
    except Exception as exc:  # noqa: BLE001 - counted
        return f"{type(exc).__name__}: {exc}", time.perf_counter() - start, None


# --- the process ------------------------------------------------------------------------------


def team_a(kind: str, conn: Any, port: int, key: str, job_a: str, stream_rate: float) -> None:
    """The child process: the uploads or the streams attack, talking to `phases` on `conn`."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    attack = _uploads(conn, port, key) if kind == "uploads" else _streams(
        conn, port, key, job_a, stream_rate
    )  # fmt: skip
    asyncio.run(attack)


async def _uploads(conn: Any, port: int, key: str) -> None:
    uploads = [SlowUpload(port, key) for _ in range(SLOW_UPLOADS)]
    for u in uploads:
        await u.open()
    stop = asyncio.Event()
    trickles = [asyncio.create_task(u.trickle(stop)) for u in uploads]
    conn.send("open")
    await asyncio.to_thread(conn.recv)  # "finish": send the rest of every body
    stop.set()
    await asyncio.gather(*trickles)
    answers = await asyncio.gather(*(u.finish() for u in uploads))
    conn.send({
        "bytes_trickled_each_min": min(u.sent for u in uploads),
        "stored_201": answers.count("201"),
        "errors": [a for a in answers if a != "201"][:3],
    })  # fmt: skip


async def _streams(conn: Any, port: int, key: str, job_a: str, rate: float) -> None:
    conn.send("ready")
    t0, tasks = time.perf_counter(), []
    for i in range(STREAM_ATTEMPTS):
        if (delay := t0 + i / rate - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(open_stream(port, key, job_a)))
    results = await asyncio.gather(*tasks)
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    refused_ms = sorted(t * 1000 for s, t, _ in results if s.startswith("429"))
    conn.send({
        "statuses": statuses,
        "refusal_p99_ms": round(percentile(refused_ms, 99), 2) if refused_ms else None,
    })  # fmt: skip
    await asyncio.to_thread(conn.recv)  # "close": every client leaves
    for _, _, writer in results:
        if writer is not None:
            writer.close()
    await asyncio.sleep(0.5)
    again, _, writer = await open_stream(port, key, job_a)  # the slots came back
    if writer is not None:
        writer.close()
    conn.send(again == "200")


def start_team_a(kind: str, *args: Any) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=team_a, args=(kind, there, *args), daemon=True)
    proc.start()
    return proc, here
