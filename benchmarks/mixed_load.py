"""Mixed read/write API load on PostgreSQL: the highest arrival rate served with zero errors.

Against a real uvicorn subprocess on a fresh PostgreSQL database and a Redis database number
of its own (the helpers of benchmarks/api_load.py: created, checked empty, dropped/flushed
afterwards), from this process over loopback. Open loop: request i is due at t0 + i/rate and
its latency runs from that due time (queueing counted; no coordinated omission). Each request
has a 10 s timeout; the run is bounded by rate x seconds requests.

The mix (weights out of 20), on one team's data:
    reads  (14): GET /v1/jobs (4), GET /v1/jobs/{id} (4), GET /v1/jobs/{id}/events (2),
                 GET /v1/jobs/{id}/metrics (1), GET /v1/files (2), GET /v1/files/{id} (1)
    writes  (6): POST /v1/jobs (3, with an Idempotency-Key), POST /v1/jobs/{id}/cancel (2,
                 each on a job nobody cancelled yet), POST /v1/files (1, an 8-line JSONL)

Rate search: short probes (4 s; --quick 3 s) at doubling rates from --start-rate until a
probe has an error, lags (served < 95 % of offered) or its p99 passes --max-p99-ms; then
bisection between the last good and first bad rate (3 steps). The rate found is then held
for --seconds (60; --quick 15); a hold that fails the same test is retried at 0.7x the rate
(--retries, 2), and the last hold is the result ("sustained" says whether it passed).

    python benchmarks/mixed_load.py --quick     # < 90 s in all
    python benchmarks/mixed_load.py             # 60 s at the rate found

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import httpx
from api_load import (
    create_database,
    drop_database,
    empty_redis_db,
    free_port,
    percentile,
    prepare_database,
    start_server,
    upload_training_file,
)

TIMEOUT_S = 10.0
MAX_INFLIGHT = 256
MIX = [
    ("GET /v1/jobs", 4),
    ("GET /v1/jobs/{id}", 4),
    ("GET /v1/jobs/{id}/events", 2),
    ("GET /v1/jobs/{id}/metrics", 1),
    ("GET /v1/files", 2),
    ("GET /v1/files/{id}", 1),
    ("POST /v1/jobs", 3),
    ("POST /v1/jobs/{id}/cancel", 2),
    ("POST /v1/files", 1),
]
SMALL_FILE = "".join(
    json.dumps({"prompt": f"Q{i}?", "chosen": "yes", "rejected": "no"}) + "\n" for i in range(8)
).encode()


class Mix:
    """Picks the next request (seeded) and keeps the ids the reads and cancels need."""

    def __init__(self, file_id: str, job_ids: list[str], seed: int = 0):
        self.rng = random.Random(seed)
        self.routes = [r for r, w in MIX for _ in range(w)]
        self.file_ids = [file_id]
        self.job_ids = list(job_ids)
        self.cancellable = list(job_ids)
        self.body = {"base_model": "tiny-llama", "training_file": file_id, "objective": "dpo"}

    def next(self) -> str:
        route = self.rng.choice(self.routes)
        if route.endswith("/cancel") and not self.cancellable:
            return "GET /v1/jobs/{id}"
        return route

    async def send(self, http: httpx.AsyncClient, route: str) -> httpx.Response:
        job = self.rng.choice(self.job_ids)
        if route == "GET /v1/jobs":
            return await http.get("/v1/jobs", params={"limit": 20})
        if route == "GET /v1/jobs/{id}":
            return await http.get(f"/v1/jobs/{job}")
        if route == "GET /v1/jobs/{id}/events":
            return await http.get(f"/v1/jobs/{job}/events")
        if route == "GET /v1/jobs/{id}/metrics":
            return await http.get(f"/v1/jobs/{job}/metrics")
        if route == "GET /v1/files":
            return await http.get("/v1/files", params={"limit": 20})
        if route == "GET /v1/files/{id}":
            return await http.get(f"/v1/files/{self.rng.choice(self.file_ids)}")
        if route == "POST /v1/jobs":
            r = await http.post(
                "/v1/jobs", json=self.body, headers={"Idempotency-Key": secrets.token_hex(8)}
            )
            if r.status_code == 201:
                self.job_ids.append(r.json()["id"])
                self.cancellable.append(r.json()["id"])
            return r
        if route == "POST /v1/jobs/{id}/cancel":
            target = self.cancellable.pop(self.rng.randrange(len(self.cancellable)))
            return await http.post(f"/v1/jobs/{target}/cancel")
        if route == "POST /v1/files":
            r = await http.post(
                "/v1/files",
                files={"file": ("small.jsonl", SMALL_FILE, "application/jsonl")},
                data={"purpose": "train"},
            )
            if r.status_code == 201:
                self.file_ids.append(r.json()["id"])
            return r
        raise ValueError(route)


async def run_load(http: httpx.AsyncClient, mix: Mix, rate: float, seconds: float) -> dict:
    n = max(1, int(rate * seconds))
    rows: list[tuple[str, float, bool, str | None]] = []
    inflight = 0

    async def one(route: str, due: float) -> None:
        nonlocal inflight
        if inflight >= MAX_INFLIGHT:
            rows.append((route, TIMEOUT_S, False, "dropped: too many in flight"))
            return
        inflight += 1
        try:
            async with asyncio.timeout(TIMEOUT_S):
                r = await mix.send(http, route)
            ok = 200 <= r.status_code < 300
            detail = None if ok else f"{route}: {r.status_code} {r.text[:200]}"
        except Exception as exc:  # noqa: BLE001 - transport errors and timeouts count
            ok, detail = False, f"{route}: {type(exc).__name__}: {exc}"
        finally:
            inflight -= 1
        rows.append((route, time.perf_counter() - due, ok, detail))

    tasks = []
    t0 = time.perf_counter() + 0.05
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(mix.next(), due)))
    await asyncio.wait(tasks)
    elapsed = time.perf_counter() - t0
    ms = sorted(r[1] * 1000 for r in rows)
    errors = [r[3] for r in rows if not r[2]]
    by_route: dict[str, Any] = {}
    for route, _ in MIX:
        rms = sorted(r[1] * 1000 for r in rows if r[0] == route)
        if rms:
            by_route[route] = {
                "requests": len(rms),
                "p50_ms": round(percentile(rms, 50), 2),
                "p99_ms": round(percentile(rms, 99), 2),
            }
    writes = sum(1 for r in rows if r[0].startswith("POST"))
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "requests": len(rows),
        "writes": writes,
        "throughput_per_s": round(len(rows) / elapsed, 1),
        "lag": elapsed > seconds * 1.05 + 0.5,  # the server could not keep up
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(ms[-1], 2),
        "by_route": by_route,
    }


def sustained(result: dict, max_p99_ms: float) -> bool:
    return result["errors"] == 0 and not result["lag"] and result["p99_ms"] <= max_p99_ms


async def search_and_run(port: int, key: str, file_id: str, args) -> dict:
    limits = httpx.Limits(max_connections=MAX_INFLIGHT, max_keepalive_connections=MAX_INFLIGHT)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        limits=limits,
        timeout=TIMEOUT_S,
    ) as http:
        seed_jobs = []
        for _ in range(20):
            r = await http.post("/v1/jobs", json=Mix(file_id, []).body)
            r.raise_for_status()
            seed_jobs.append(r.json()["id"])
        mix = Mix(file_id, seed_jobs)
        await run_load(http, mix, args.start_rate, 2.0)  # warm-up, not recorded
        probes = []
        good, bad, rate = 0.0, None, args.start_rate
        while rate <= args.max_rate:
            res = await run_load(http, mix, rate, args.probe_seconds)
            probes.append({k: res[k] for k in ("offered_rate", "errors", "lag", "p99_ms")})
            if not sustained(res, args.max_p99_ms):
                bad = rate
                break
            good, rate = rate, rate * 2
        if bad is not None:
            for _ in range(3):
                mid = round((good + bad) / 2, 1)
                if mid - good < 2:
                    break
                await asyncio.sleep(1)  # let a backlog from the failed probe drain
                res = await run_load(http, mix, mid, args.probe_seconds)
                probes.append({k: res[k] for k in ("offered_rate", "errors", "lag", "p99_ms")})
                good, bad = (mid, bad) if sustained(res, args.max_p99_ms) else (good, mid)
        rate = good or args.start_rate / 2
        holds = []
        for _ in range(1 + args.retries):  # a short probe can pass where a long hold fails
            await asyncio.sleep(2)  # let any backlog drain
            final = await run_load(http, mix, rate, args.seconds)
            final["sustained"] = sustained(final, args.max_p99_ms)
            holds.append({k: final[k] for k in ("offered_rate", "errors", "lag", "p99_ms")})
            if final["sustained"]:
                break
            rate = round(rate * 0.7, 1)
        final["probes"] = probes
        final["holds"] = holds
        return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s final run, 3 s probes")
    parser.add_argument("--seconds", type=float, default=None, help="final run (60; quick 15)")
    parser.add_argument("--probe-seconds", type=float, default=None, help="4; quick 3")
    parser.add_argument("--start-rate", type=float, default=25.0)
    parser.add_argument("--max-rate", type=float, default=1600.0)
    parser.add_argument("--max-p99-ms", type=float, default=250.0, help="a probe above fails")
    parser.add_argument("--retries", type=int, default=2, help="holds at 0.7x after a failed one")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get(
            "HUMANLINE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", type=int, default=13, help="an unused Redis database")
    args = parser.parse_args()
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    args.probe_seconds = args.probe_seconds or (3.0 if args.quick else 4.0)

    broker = f"{args.redis_url.rstrip('/')}/{args.redis_db}"
    redis_client = empty_redis_db(broker)
    tmp = Path(tempfile.mkdtemp(prefix="hl-mixed-load-"))
    db_url = create_database(args.pg_admin_url)
    proc = None
    started = time.monotonic()
    try:
        key = prepare_database(db_url)
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "STORAGE_URL": f"file://{tmp / 'objects'}",
            "BROKER_URL": broker,
            "MAX_JOBS_PER_TEAM": "1000000",
            "LOG_LEVEL": "INFO",
            "PYTHONPATH": str(REPO),
        }
        port = free_port()
        proc = start_server(env, port, args.workers, tmp / "server.log")
        file_id = upload_training_file(f"http://127.0.0.1:{port}", key)
        result = asyncio.run(search_and_run(port, key, file_id, args))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        redis_client.flushdb()
        drop_database(args.pg_admin_url, db_url)
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        tmp.rmdir()

    for p in result["probes"]:
        print(f"probe {p['offered_rate']}/s: errors {p['errors']}, lag {p['lag']}, "
              f"p99 {p['p99_ms']} ms")  # fmt: skip
    print(
        f"sustained {result['offered_rate']}/s for {result['seconds']:.0f} s: "
        f"{result['requests']} requests ({result['writes']} writes), "
        f"{result['throughput_per_s']}/s, {result['errors']} errors, "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms"
    )
    print(
        json.dumps(
            {
                "benchmark": "mixed_load",
                "workers": args.workers,
                "rate_per_s": result["offered_rate"],
                "throughput_per_s": result["throughput_per_s"],
                "requests": result["requests"],
                "writes": result["writes"],
                "errors": result["errors"],
                "first_errors": result["first_errors"],
                "p50_ms": result["p50_ms"],
                "p99_ms": result["p99_ms"],
                "max_ms": result["max_ms"],
                "sustained": result["sustained"],
                "seconds": result["seconds"],
                "by_route": result["by_route"],
                "probes": result["probes"],
                "holds": result["holds"],
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
