"""Upload throughput: POST /v1/files of a large preference JSONL through a real uvicorn server.

The benchmark writes a TRL-style preference file ({"prompt", "chosen", "rejected"} strings,
a few hundred bytes to a few KB per line, some non-ASCII text and escaped newlines) to a
temporary directory, starts `uvicorn --factory api.main:server_app` as a subprocess on a fresh
database (SQLite by default, or --database-url) and a local object store, and uploads the file
with httpx as a streamed multipart body (1 MiB chunks read from disk, Content-Length known,
never the whole file in memory). The clock runs from the first byte sent to the 201 response,
so the figure covers receiving, multipart parsing, line-by-line validation, hashing, writing
the object and the DB row. The response's byte count, record count and sha256 are checked
against the file.

Memory: before the upload (after an untimed warm-up upload, so imports are paid), the
server's peak RSS (VmHWM) is reset through /proc/<pid>/clear_refs and its VmRSS read; during
the upload VmRSS is sampled every 10 ms; growth = max(VmHWM after, sampled peak) − VmRSS
before. With --workers N the figure is the worst worker's.

Targets (service issue): throughput ≥ 50 MB/s and server peak RSS growth < 100 MB
(MB = 10^6 bytes), i.e. the upload is streamed and never held in memory.

    python benchmarks/upload_throughput.py --quick        # 50 MB, < 60 s
    python benchmarks/upload_throughput.py                # 200 MB, the median of 3 uploads
    python benchmarks/upload_throughput.py --database-url postgresql://postgres@127.0.0.1/x

The last line printed is one JSON object with every figure and its target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from apiserver import free_port, prepare_database, server_pids, start_server, stop_server
from procfs import cpu_seconds, reset_peak, status_kb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_MB_S = 50.0
TARGET_RSS_GROWTH_MB = 100.0
MB = 1_000_000
CHUNK = 1 << 20

# common English words, the vocabulary of the texts, and a few non-ASCII ones
_WORDS = (
    "the of and to in is that for it as was with be by on not this are or from at which but "
    "have an they you were all one their would what so up out if about who get make can like "
    "time just know take people into year your good some could them see other than then now "
    "look only come its over think also back after use two how our work first well way even "
    "new want because any these give day most gradient model loss reference policy reward "
    "humanline clip sync token batch answer question explain step result therefore equation "
    "naïve café résumé données 数据 模型 训练 ответ пример"
).split()


# --- the data -------------------------------------------------------------------------------


def _text(rng: random.Random, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    words: list[str] = []
    size = 0
    while size < target:
        word = rng.choice(_WORDS)
        if rng.random() < 0.04:
            word += ".\n"
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def write_preferences(path: Path, total_bytes: int, seed: int = 0) -> tuple[int, int, str]:
    """TRL preference lines until `total_bytes`; returns (bytes, records, sha256).

    Texts come from a pool of 3,000 random passages (prompts 60-600 characters, answers
    100-1,800) combined per record, so a line is 300 B to ~4 KB, ~2.6 KB on average; half
    the lines keep their UTF-8 text raw, half have it escaped (\\uXXXX)."""
    rng = random.Random(seed)
    prompts = [_text(rng, 60, 600) for _ in range(1000)]
    answers = [_text(rng, 100, 1800) for _ in range(2000)]
    digest = hashlib.sha256()
    size = records = 0
    with open(path, "wb") as fh:
        while size < total_bytes:
            rec = {
                "prompt": rng.choice(prompts),
                "chosen": rng.choice(answers),
                "rejected": rng.choice(answers),
            }
            line = (json.dumps(rec, ensure_ascii=rng.random() < 0.5) + "\n").encode()
            fh.write(line)
            digest.update(line)
            size += len(line)
            records += 1
    return size, records, digest.hexdigest()


def multipart_body(
    path: Path, boundary: str, purpose: str = "train"
) -> tuple[int, Iterator[bytes]]:
    """(Content-Length, chunks) of a multipart/form-data body: `purpose`, then the file."""
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
        f"Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def chunks() -> Iterator[bytes]:
        yield head
        with open(path, "rb") as fh:
            while block := fh.read(CHUNK):
                yield block
        yield tail

    return len(head) + path.stat().st_size + len(tail), chunks()


# --- the server's memory (the server: apiserver.py) -----------------------------------------------


class RssSampler(threading.Thread):
    def __init__(self, pids: list[int], period: float = 0.01):
        super().__init__(daemon=True)
        self.pids = pids
        self.period = period
        self.peak_kb = {p: 0 for p in pids}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for p in self.pids:
                try:
                    self.peak_kb[p] = max(self.peak_kb[p], status_kb("VmRSS", p))
                except (OSError, KeyError):
                    pass
            self._halt.wait(self.period)

    def stop(self) -> dict[int, int]:
        self._halt.set()
        self.join()
        return self.peak_kb


# --- one upload -------------------------------------------------------------------------------


def upload(client: httpx.Client, path: Path, key: str) -> tuple[float, dict]:
    boundary = "hl" + secrets.token_hex(16)
    length, body = multipart_body(path, boundary)
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(length),
    }
    start = time.perf_counter()
    response = client.post("/v1/files", content=body, headers=headers)
    seconds = time.perf_counter() - start
    if response.status_code != 201:
        raise SystemExit(f"upload failed: {response.status_code} {response.text[:2000]}")
    return seconds, response.json()


def measured_upload(client, path, key, pids, expect) -> dict:
    before = {}
    peak_reset = all(reset_peak(p) for p in pids)
    for p in pids:
        before[p] = status_kb("VmRSS", p)
    sampler = RssSampler(pids)
    cpu_before = cpu_seconds(pids)
    sampler.start()
    seconds, body = upload(client, path, key)
    sampled = sampler.stop()
    cpu = cpu_seconds(pids) - cpu_before
    growth_kb = 0
    for p in pids:
        peak = max(sampled[p], status_kb("VmHWM", p) if peak_reset else 0)
        growth_kb = max(growth_kb, peak - before[p])
    size, records, sha = expect
    if (body["bytes"], body["records"], body["sha256"]) != (size, records, sha):
        raise SystemExit(f"server stored something else: {body}")
    return {
        "seconds": seconds,
        "mb_s": size / MB / seconds,
        "server_cpu_s": cpu,
        "rss_before_mb": max(before.values()) * 1024 / MB,
        "rss_growth_mb": growth_kb * 1024 / MB,
        "file_id": body["id"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 MB, one upload, < 60 s")
    parser.add_argument("--size-mb", type=float, default=None, help="default 200 (quick: 50)")
    parser.add_argument("--repeat", type=int, default=None, help="uploads (default 3, quick 1)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--database-url", default=None, help="a database to migrate and use (default: SQLite)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    size_mb = args.size_mb or (50.0 if args.quick else 200.0)
    repeat = args.repeat or (1 if args.quick else 3)

    tmp = Path(tempfile.mkdtemp(prefix="hl-upload-bench-"))
    proc = None
    try:
        path = tmp / "preferences.jsonl"
        t0 = time.perf_counter()
        expect = write_preferences(path, int(size_mb * MB))
        print(
            f"generated {expect[0] / MB:.1f} MB, {expect[1]} records in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        db_url = args.database_url or f"sqlite:///{tmp / 'humanline.db'}"
        key = prepare_database(db_url)
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "STORAGE_URL": f"file://{tmp / 'objects'}",
            "BROKER_URL": "memory://",  # no job is created here
            "MAX_UPLOAD_BYTES": str(max(1 << 30, 2 * expect[0])),
            "LOG_LEVEL": "WARNING",
            "TMPDIR": str(tmp),  # the multipart spool file lands here
            "PYTHONPATH": str(REPO),
        }
        port = free_port()
        proc = start_server(env, port, args.workers, tmp / "server.log")
        pids = server_pids(proc.pid, args.workers)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            warm = tmp / "warm.jsonl"  # untimed: imports, first connection, first DB write
            write_preferences(warm, 256 * 1024, seed=1)
            for _ in range(max(2, args.workers * 2)):
                upload(client, warm, key)
            runs = []
            for i in range(repeat):
                run = measured_upload(client, path, key, pids, expect)
                stored = tmp / "objects"
                sizes = [p.stat().st_size for p in stored.rglob(run["file_id"] + "*")]
                if expect[0] not in sizes:
                    raise SystemExit(f"object of {run['file_id']} missing or wrong size: {sizes}")
                runs.append(run)
                print(
                    f"upload {i + 1}/{repeat}: {run['seconds']:.2f} s, {run['mb_s']:.1f} MB/s, "
                    f"server CPU {run['server_cpu_s']:.2f} s, "
                    f"server RSS {run['rss_before_mb']:.0f} MB + {run['rss_growth_mb']:.1f} MB",
                    flush=True,
                )
    finally:
        stop_server(proc)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    mb_s = statistics.median(r["mb_s"] for r in runs)
    growth = max(r["rss_growth_mb"] for r in runs)
    result = {
        "benchmark": "upload_throughput",
        "file_mb": round(expect[0] / MB, 1),
        "records": expect[1],
        "uploads": repeat,
        "workers": args.workers,
        "database": db_url.split(":", 1)[0],
        "seconds_median": round(statistics.median(r["seconds"] for r in runs), 2),
        "throughput_mb_s": round(mb_s, 1),
        "throughput_mb_s_each": [round(r["mb_s"], 1) for r in runs],
        "target_throughput_mb_s": TARGET_MB_S,
        "server_cpu_s_median": round(statistics.median(r["server_cpu_s"] for r in runs), 2),
        "mb_per_server_cpu_s": round(
            expect[0] / MB / statistics.median(r["server_cpu_s"] for r in runs), 1
        ),
        "rss_before_mb": round(max(r["rss_before_mb"] for r in runs), 1),
        "rss_peak_growth_mb": round(growth, 1),
        "target_rss_peak_growth_mb": TARGET_RSS_GROWTH_MB,
        "throughput_met": mb_s >= TARGET_MB_S,
        "rss_met": growth < TARGET_RSS_GROWTH_MB,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    result["met"] = result["throughput_met"] and result["rss_met"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
