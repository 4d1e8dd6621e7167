"""Mixed read/write API load on PostgreSQL: the highest arrival rate served with zero errors.

Against a real uvicorn subprocess on a fresh PostgreSQL database and a Redis database number
of its own (benchmarks/apiserver.py: created, checked empty, dropped/flushed afterwards),
from this process over loopback. Open loop (benchmarks/openloop.py): request i is due at
t0 + i/rate and its latency runs from that due time (queueing counted; no coordinated
omission). Each request has a 10 s timeout; the run is bounded by rate x seconds requests.

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
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from apiserver import add_service_options, on_postgres  # noqa: E402 - on the path above
from openloop import http_client, latencies, open_loop  # noqa: E402 - on the path above

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
    async def send(route: str) -> tuple[bool, str | None]:
        r = await mix.send(http, route)
        ok = 200 <= r.status_code < 300
        return ok, None if ok else f"{r.status_code} {r.text[:200]}"

    sent, elapsed = await open_loop(rate, max(1, int(rate * seconds)), lambda i: mix.next(), send)
    by_route: dict[str, Any] = {}
    for route, _ in MIX:
        rows = [s for s in sent if s.route == route]
        if rows:
            by_route[route] = {"requests": len(rows), **latencies(rows, 50, 99)}
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "requests": len(sent),
        "writes": sum(1 for s in sent if s.route.startswith("POST")),
        "throughput_per_s": round(len(sent) / elapsed, 1),
        "lag": elapsed > seconds * 1.05 + 0.5,  # the server could not keep up
        "errors": sum(1 for s in sent if not s.ok),
        "first_errors": [f"{s.route}: {s.detail}" for s in sent if not s.ok][:3],
        **latencies(sent, 50, 99),
        "by_route": by_route,
    }


def sustained(result: dict, max_p99_ms: float) -> bool:
    return result["errors"] == 0 and not result["lag"] and result["p99_ms"] <= max_p99_ms


async def search_and_run(port: int, key: str, file_id: str, args) -> dict:
    async with http_client(port, key) as http:
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
    add_service_options(parser, redis_db=13)
    args = parser.parse_args()
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    args.probe_seconds = args.probe_seconds or (3.0 if args.quick else 4.0)

    started = time.monotonic()
    env = {"MAX_JOBS_PER_TEAM": "1000000", "LOG_LEVEL": "INFO"}
    with on_postgres(args, "hl-mixed-load-", env) as served:
        result = asyncio.run(search_and_run(served.port, served.key, served.file_id, args))

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
