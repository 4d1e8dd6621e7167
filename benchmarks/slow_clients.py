"""Slow and greedy clients of one team against another team's latency (issue 14, figures).

Against a real `uvicorn --factory api.main:server_app` subprocess (one process) on a fresh
PostgreSQL database (created for the run, dropped afterwards; --sqlite: a SQLite file, the
embedded default) and a local object store, from this process over loopback. Team B sends an
open-loop load all along: GET /v1/jobs (its 20 jobs, newest 20) and GET /healthz, each at
--rate requests/s; request i is due at t0 + i/rate and its latency runs from that due time
(queueing counted). Three phases, side by side in one run, --seconds each:

    baseline  team B alone.
    uploads   team A holds 200 uploads open, each sending its body at 1 byte/s (raw
              connections: the headers, then one byte a second). The server runs with
              UPLOAD_MAX_PER_TEAM = UPLOAD_MAX_CONCURRENT = 256, so all 200 are admitted and
              in progress at once (the defaults, 8 and 32, would refuse most of them with
              429 at once: that is tested in tests/api/test_slow_clients.py). Team B is
              measured from 2 s after the server's gauge humanline_uploads_in_progress (on
              its METRICS_PORT) reads 200, not during the burst of their 200 starts. At the
              end of the phase each upload sends the rest of its body: all 200 must be 201.
    streams   team A attempts 2,000 event streams (GET /v1/jobs/{id}/events/stream on its
              queued job), --stream-rate a second, and holds open those admitted; the server
              has the default caps (STREAMS_PER_TEAM 20, STREAMS_TOTAL 100). Every attempt
              must be 200 (admitted: at most STREAMS_PER_TEAM) or 429 with Retry-After. Then
              every stream is closed, and a new stream of team A must be admitted at once
              (the slots came back when the clients left).

Targets: during each phase, team B's GET /v1/jobs p99 < 100 ms and /healthz p99 < 50 ms with
zero errors; every slow upload admitted and stored (201); the stream cap answers 429, nothing
else but 200 and 429; no error in the server's log.

    python benchmarks/slow_clients.py --quick      # 6 s phases, < 60 s in all
    python benchmarks/slow_clients.py              # 30 s phases
    python benchmarks/slow_clients.py --sqlite     # the embedded default's database

The last line printed is one JSON object with every figure and its target.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
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

import apiserver  # noqa: E402 - after the path setup
import httpx  # noqa: E402
from api_load import RawHttpClient  # noqa: E402
from apiserver import create_database, drop_database, free_port, start_server  # noqa: E402
from openloop import percentile  # noqa: E402
from slow_clients_attack import (  # noqa: E402
    CONTENT,
    SLOW_UPLOADS,
    STREAM_ATTEMPTS,
    TIMEOUT_S,
    start_team_a,
)

UPLOAD_CAP = 256  # the uploads phase admits all 200 (see the docstring)
TARGETS_MS = {"GET /v1/jobs": 100.0, "GET /healthz": 50.0}
MAX_INFLIGHT = 256
SETTLE_S = 2.0


def raise_fd_limit() -> None:
    """2,000 streams and 200 uploads are as many sockets, here and in the server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def prepare_teams(url: str) -> dict[str, tuple[str, str]]:
    """Migrate; teams A and B with a key each: {"A": (team_id, key), "B": ...}."""
    from api.cli import migrate_database
    from models.db import make_engine, make_session_factory, session_scope
    from models.teams import create_api_key, create_team

    migrate_database(url)
    engine = make_engine(url)
    out = {}
    with session_scope(make_session_factory(engine)) as session:
        for name in ("A", "B"):
            team = create_team(session, f"bench-{name}-{secrets.token_hex(4)}")
            _, key = create_api_key(session, team.id, "benchmark")
            out[name] = (team.id, key)
    engine.dispose()
    return out


def seed_jobs(base_url: str, key: str, n: int) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        r = http.post(
            "/v1/files",
            files={"file": ("prefs.jsonl", CONTENT, "application/jsonl")},
            data={"purpose": "train"},
        )
        r.raise_for_status()
        body = {"base_model": "tiny-llama", "training_file": r.json()["id"], "objective": "dpo",
                "batch_size": 4}  # fmt: skip
        ids = []
        for _ in range(n):
            r = http.post("/v1/jobs", json=body)
            r.raise_for_status()
            ids.append(r.json()["id"])
    return ids


# --- team B's load ----------------------------------------------------------------------------


class TeamBLoad:
    """Open-loop GET /v1/jobs and GET /healthz, each at `rate`/s, until stopped."""

    def __init__(self, port: int, key: str, rate: float):
        self.client = RawHttpClient(port, key, {})
        head = f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        self.client.requests = {
            "GET /v1/jobs": f"GET /v1/jobs?limit=20 HTTP/1.1\r\n{head}\r\n".encode(),
            "GET /healthz": f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode(),
        }
        self.rate = rate
        self.rows: dict[str, list[tuple[float, bool, str | None]]] = {r: [] for r in TARGETS_MS}
        self.inflight = 0

    async def _one(self, route: str, due: float) -> None:
        if self.inflight >= MAX_INFLIGHT:
            self.rows[route].append((TIMEOUT_S, False, "dropped: too many in flight"))
            return
        self.inflight += 1
        try:
            async with asyncio.timeout(TIMEOUT_S):
                status, body = await self.client.send(route)
            ok = status == 200
            detail = None if ok else f"{status} {body[:200]!r}"
        except Exception as exc:  # noqa: BLE001 - transport errors, timeouts: all count
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        finally:
            self.inflight -= 1
        self.rows[route].append((time.perf_counter() - due, ok, detail))

    async def run(self, seconds: float) -> dict[str, dict]:
        self.rows = {r: [] for r in TARGETS_MS}
        tasks, routes = [], list(TARGETS_MS)
        period = 1 / (self.rate * len(routes))
        t0 = time.perf_counter() + 0.02
        for i in range(int(seconds * self.rate * len(routes))):
            due = t0 + i * period
            if (delay := due - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(routes[i % len(routes)], due)))
        await asyncio.wait(tasks)
        return {route: summarize(rows) for route, rows in self.rows.items()}


def summarize(rows: list[tuple[float, bool, str | None]]) -> dict[str, Any]:
    ms = sorted(r[0] * 1000 for r in rows)
    errors = [r[2] for r in rows if not r[1]]
    return {
        "requests": len(rows),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(ms[-1], 2),
    }


# --- the phases -------------------------------------------------------------------------------


async def read_gauge(port: int, name: str) -> float | None:
    """A gauge of the server's metrics listener (METRICS_PORT); None if it has none (a server
    from before the gauges, see --server-repo)."""
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def wait_for_gauge(port: int, name: str, value: float, timeout: float = 60) -> float | None:
    """Seconds until the gauge reads `value`; None (after 1 s) if the server has no gauge."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        got = await read_gauge(port, name)
        if got is None and time.perf_counter() - start > 1:
            return None
        if got == value:
            return round(time.perf_counter() - start, 2)
        await asyncio.sleep(0.1)
    raise SystemExit(f"{name} did not reach {value} in {timeout:g} s")


async def phases(port: int, teams: dict, job_a: str, args) -> dict[str, Any]:
    load = TeamBLoad(port, teams["B"][1], args.rate)
    key_a = teams["A"][1]
    await load.run(2.0)  # warm-up: connections, key cache, first queries; not recorded
    start = time.time()
    out: dict[str, Any] = {"baseline": {"team_b": await load.run(args.seconds)}}
    out["baseline"]["window"] = (start, time.time())

    # uploads: 200 open at 1 byte/s while B is measured, then each sends the rest
    proc, conn = start_team_a("uploads", port, key_a, job_a, args.stream_rate)
    assert await asyncio.to_thread(conn.recv) == "open"
    # measure with all 200 in progress, not the burst of their 200 starts (auth, ...): once
    # the gauge reads 200, and SETTLE_S later (their last transactions end after the gauge)
    admitted_in = await wait_for_gauge(args.metrics_port, "humanline_uploads_in_progress",
                                       SLOW_UPLOADS)  # fmt: skip
    await asyncio.sleep(SETTLE_S)
    start = time.time()
    team_b = await load.run(args.seconds)
    window = (start, time.time())
    conn.send("finish")
    done = await asyncio.to_thread(conn.recv)
    proc.join(30)
    out["uploads"] = {"team_b": team_b, "window": window, "slow_uploads": SLOW_UPLOADS,
                      "all_in_progress_after_s": admitted_in, **done}  # fmt: skip

    # streams: 2,000 attempts by team A at --stream-rate/s, held; B measured meanwhile
    proc, conn = start_team_a("streams", port, key_a, job_a, args.stream_rate)
    assert await asyncio.to_thread(conn.recv) == "ready"
    start = time.time()
    team_b = await load.run(max(args.seconds, STREAM_ATTEMPTS / args.stream_rate + 1))
    attempts = await asyncio.to_thread(conn.recv)
    window = (start, time.time())
    open_gauge = await read_gauge(args.metrics_port, "humanline_event_streams_open")
    conn.send("close")
    again = await asyncio.to_thread(conn.recv)
    proc.join(30)
    statuses = attempts["statuses"]
    out["streams"] = {
        "team_b": team_b,
        "window": window,
        "attempts": STREAM_ATTEMPTS,
        "attempt_rate_per_s": args.stream_rate,
        "statuses": statuses,
        "admitted": statuses.get("200", 0),
        "server_streams_open": open_gauge,
        "refused_429": statuses.get("429", 0),
        "refusal_p99_ms": attempts["refusal_p99_ms"],
        "admitted_after_all_closed": again,
    }
    await load.client.aclose()
    return out


def server_side(log_text: str, out: dict) -> None:
    """Each phase's server-side durations (the access log's duration_ms: from the request's
    arrival in the app to the end of its response) of team B's routes and of the refused
    stream attempts: what the server spent, apart from the client's and the machine's delays."""
    from datetime import datetime

    routes = {"/v1/jobs": "GET /v1/jobs", "/healthz": "GET /healthz",
              "/v1/jobs/{job_id}/events/stream": "stream refused"}  # fmt: skip
    rows: list[tuple[float, str, float, int]] = []
    for line in log_text.splitlines():
        if '"message": "request"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("route") in routes and rec.get("method") == "GET":
            ts = datetime.fromisoformat(rec["ts"]).timestamp()
            rows.append((ts, routes[rec["route"]], rec["duration_ms"], rec["status"]))
    for res in out.values():
        start, end = res.pop("window")
        res["server_side_ms"] = {}
        for name in routes.values():
            ms = sorted(
                d for ts, r, d, status in rows
                if r == name and start <= ts <= end and (r != "stream refused" or status == 429)
            )  # fmt: skip
            if ms:
                res["server_side_ms"][name] = {
                    "requests": len(ms), "p50": round(percentile(ms, 50), 2),
                    "p99": round(percentile(ms, 99), 2),
                }  # fmt: skip


def figures(out: dict, streams_per_team: int) -> dict[str, dict]:
    figs: dict[str, dict] = {}
    for phase in ("baseline", "uploads", "streams"):
        for route, target in TARGETS_MS.items():
            r = out[phase]["team_b"][route]
            name = f"{phase}.team_b.{route.split()[1].strip('/').replace('/', '_')}"
            figs[f"{name}.p99_ms"] = {"value": r["p99_ms"], "target": f"< {target:g}",
                                      "met": r["p99_ms"] < target}  # fmt: skip
            figs[f"{name}.errors"] = {"value": r["errors"], "target": "0", "met": r["errors"] == 0}
    up, st = out["uploads"], out["streams"]
    figs["uploads.stored_201"] = {"value": up["stored_201"], "target": f"{SLOW_UPLOADS}",
                                  "met": up["stored_201"] == SLOW_UPLOADS}  # fmt: skip
    others = sum(v for k, v in st["statuses"].items() if k not in ("200", "429"))
    figs["streams.refused_429"] = {"value": st["refused_429"], "target": "> 0",
                                   "met": st["refused_429"] > 0}  # fmt: skip
    figs["streams.admitted"] = {"value": st["admitted"], "target": f"<= {streams_per_team}",
                                "met": 0 < st["admitted"] <= streams_per_team}  # fmt: skip
    figs["streams.other_answers"] = {"value": others, "target": "0", "met": others == 0}
    figs["streams.admitted_after_all_closed"] = {
        "value": st["admitted_after_all_closed"], "target": "true",
        "met": st["admitted_after_all_closed"],
    }  # fmt: skip
    return figs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 s phases, < 60 s in all")
    parser.add_argument("--seconds", type=float, default=None, help="each phase (30; quick 6)")
    parser.add_argument("--rate", type=float, default=25.0, help="team B, per route, per s")
    parser.add_argument("--stream-rate", type=float, default=None,
                        help="stream attempts per s (100; quick 200)")  # fmt: skip
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument(
        "--server-repo", type=Path, default=REPO,
        help="the checkout whose server runs (default this one; another: before/after)",
    )  # fmt: skip
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get(
            "HUMANLINE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL database to connect to while creating/dropping the benchmark's own",
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (6.0 if args.quick else 30.0)
    args.stream_rate = args.stream_rate or (200.0 if args.quick else 100.0)
    raise_fd_limit()
    args.metrics_port = free_port()

    from models.settings import Settings

    streams_per_team = Settings.model_fields["STREAMS_PER_TEAM"].default
    tmp = Path(tempfile.mkdtemp(prefix="hl-slow-bench-"))
    db_url = f"sqlite:///{tmp / 'bench.db'}" if args.sqlite else create_database(args.pg_admin_url)
    proc, out = None, None
    started = time.perf_counter()
    try:
        teams = prepare_teams(db_url)
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "STORAGE_URL": f"file://{tmp / 'objects'}",
            "BROKER_URL": "memory://",  # jobs stay queued: no worker runs in server_app
            "MAX_JOBS_PER_TEAM": "100",
            "UPLOAD_MAX_PER_TEAM": str(UPLOAD_CAP),
            "UPLOAD_MAX_CONCURRENT": str(UPLOAD_CAP),
            "METRICS_PORT": str(args.metrics_port),  # the gauges the phases wait on
            "LOG_LEVEL": "INFO",  # the JSON access log is part of a request's cost
            "PYTHONPATH": str(args.server_repo),
        }
        port = free_port()
        apiserver.REPO = args.server_repo.resolve()  # start_server's working directory
        proc = start_server(env, port, 1, tmp / "server.log")
        base_url = f"http://127.0.0.1:{port}"
        seed_jobs(base_url, teams["B"][1], 20)
        (job_a,) = seed_jobs(base_url, teams["A"][1], 1)
        try:  # the load generator's own overhead is latency it would report
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
        gc.collect()
        gc.freeze()
        out = asyncio.run(phases(port, teams, job_a, args))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not args.sqlite:
            drop_database(args.pg_admin_url, db_url)
        log = tmp / "server.log"
        text = log.read_text() if log.exists() else ""
        if out is not None:
            server_side(text, out)
        errors_logged = text.count('"level": "error"')
        disconnects_logged = text.count('"message": "client disconnected"')
        for line in [x for x in text.splitlines() if '"level": "error"' in x][:2]:
            print("server error:", line[:1500])
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        tmp.rmdir()

    for phase, res in out.items():
        for route, r in res["team_b"].items():
            print(
                f"{phase:8s} team B {route}: {r['requests']} requests, {r['errors']} errors, "
                f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms"
                + (f"; first errors: {r['first_errors']}" if r["errors"] else "")
                + (
                    f"; server side p99 {side['p99']} ms"
                    if (side := res["server_side_ms"].get(route))
                    else ""
                ),
                flush=True,
            )
    up, st = out["uploads"], out["streams"]
    print(f"uploads: {up['slow_uploads']} open at 1 byte/s (all in progress "
          f"{up['all_in_progress_after_s']} s after they started; {up['bytes_trickled_each_min']}+ "
          f"bytes each), then {up['stored_201']} stored (201); errors {up['errors']}")  # fmt: skip
    print(f"streams: {st['attempts']} attempts at {st['attempt_rate_per_s']:g}/s: {st['statuses']}"
          f"; refusal p99 {st['refusal_p99_ms']} ms; admitted again after closing: "
          f"{st['admitted_after_all_closed']}")  # fmt: skip
    figs = figures(out, streams_per_team)
    figs["server_errors_logged"] = {"value": errors_logged, "target": "0",
                                    "met": errors_logged == 0}  # fmt: skip
    result = {
        "benchmark": "slow_clients",
        "quick": args.quick,
        "seconds_per_phase": args.seconds,
        "team_b_rate_per_route_per_s": args.rate,
        "database": "sqlite" if args.sqlite else "postgresql",
        "server_repo": str(args.server_repo.resolve()),
        "phases": out,
        "client_disconnects_logged": disconnects_logged,
        "figures": figs,
        "met": all(f["met"] for f in figs.values()),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
