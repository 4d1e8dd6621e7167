"""An open-loop load, shared by api_load.py and mixed_load.py.

Request i is due at t0 + i / rate whatever happened to the earlier ones, and its latency runs
from its *due* time to the end of its response, so time spent queueing, in the client or in the
server, is counted (no coordinated omission). Each request has a TIMEOUT_S timeout; past
MAX_INFLIGHT requests in flight a new one is counted as failed instead of sent (the server is
far behind: keep the client sane).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

TIMEOUT_S = 10.0
MAX_INFLIGHT = 256


@dataclass(frozen=True)
class Sent:
    route: str
    seconds: float  # from the request's due time to the end of its response
    ok: bool
    detail: str | None  # why it failed


async def open_loop(
    rate: float,
    n: int,
    pick: Callable[[int], str],
    send: Callable[[str], Awaitable[tuple[bool, str | None]]],
) -> tuple[list[Sent], float]:
    """Send n requests at `rate`: `pick(i)` names request i's route when it is due, `send(route)`
    returns (ok, detail). Returns every request's outcome and the seconds the run took."""
    sent: list[Sent] = []
    inflight = 0

    async def one(route: str, due: float) -> None:
        nonlocal inflight
        if inflight >= MAX_INFLIGHT:
            sent.append(Sent(route, TIMEOUT_S, False, "dropped: too many requests in flight"))
            return
        inflight += 1
        try:
            async with asyncio.timeout(TIMEOUT_S):
                ok, detail = await send(route)
        except Exception as exc:  # noqa: BLE001 - transport errors, timeouts: all count
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        finally:
            inflight -= 1
        sent.append(Sent(route, time.perf_counter() - due, ok, detail))

    tasks = []
    t0 = time.perf_counter() + 0.05
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(pick(i), due)))
    await asyncio.wait(tasks)  # each finishes within TIMEOUT_S
    return sent, time.perf_counter() - t0


def http_client(port: int, key: str):
    """An httpx.AsyncClient for the team's key on the loopback server, sized for the loop."""
    import httpx

    limits = httpx.Limits(max_connections=MAX_INFLIGHT, max_keepalive_connections=MAX_INFLIGHT)
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        limits=limits,
        timeout=TIMEOUT_S,
    )


def percentile(sorted_ms: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        return None
    rank = max(1, -(-len(sorted_ms) * q // 100))  # ceil(n q / 100)
    return sorted_ms[int(rank) - 1]


def latencies(sent: list[Sent], *qs: float) -> dict[str, float]:
    """p<q>_ms for each q, and max_ms, of these requests (at least one)."""
    ms = sorted(s.seconds * 1000 for s in sent)
    out = {f"p{q:g}_ms": round(percentile(ms, q), 2) for q in qs}
    out["max_ms"] = round(ms[-1], 2)
    return out
