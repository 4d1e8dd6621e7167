"""`make demo`: the main job, end to end, on the embedded default.

Starts the API with SQLite, the local object store and the in-process worker (no external
service), then, through the Python SDK over real HTTP: uploads the bundled preference set,
trains offline and offline+humanline DPO on SmolLM2-135M-Instruct with LoRA, follows both
jobs, and prints where their checkpoints and metrics are.

    python examples/demo.py [--steps 24] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEMO = REPO / ".humanline" / "demo"
DATA = REPO / "examples" / "data" / "preferences_small.jsonl"


def configure(fresh: bool) -> None:
    """Embedded-default settings, all under .humanline/demo (set before anything reads them)."""
    if fresh:
        shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DATABASE_URL=f"sqlite:///{DEMO / 'humanline.db'}",
        STORAGE_URL=f"file://{DEMO / 'objects'}",
        BROKER_URL="memory://",
        WORKER_DIR=str(DEMO / "work"),
        KEEP_RUN_DIRS="true",
        LOG_LEVEL="WARNING",
        HF_HUB_OFFLINE="1",
    )


def start_server() -> tuple[str, str, object]:
    """Migrate, create a team and key, serve the API on a free port, start the worker."""
    import uvicorn

    from api.cli import migrate_database, start_embedded_worker
    from api.main import create_app
    from models.db import make_engine, make_session_factory, session_scope
    from models.settings import get_settings
    from models.teams import create_api_key, create_team, get_team

    settings = get_settings()
    migrate_database(settings.DATABASE_URL)
    with session_scope(make_session_factory(make_engine(settings.DATABASE_URL))) as session:
        team = get_team(session, "demo") or create_team(session, "demo")
        _, key = create_api_key(session, team.id, "demo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    worker = start_embedded_worker(settings)
    return f"http://127.0.0.1:{port}", key, worker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps per job")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--keep", action="store_true", help="keep the previous demo's database and objects")
    args = ap.parse_args()
    configure(fresh=not args.keep)
    t0 = time.time()
    base_url, key, worker = start_server()
    print(f"API on {base_url} (SQLite, local store, in-process worker under {DEMO})")

    from humanline_client import Client

    client = Client(base_url=base_url, api_key=key)
    upload = client.files.upload(file=DATA, purpose="train")
    print(f"uploaded {DATA.name}: {upload.id}, {upload.records} {upload.format} records")

    common = dict(
        base_model=args.model, training_file=upload.id, objective={"name": "dpo", "beta": 0.1},
        adapter={"kind": "lora", "r": 8, "alpha": 16}, batch_size=4, max_steps=args.steps,
        checkpoint_every=max(1, args.steps // 3), max_length=160, max_prompt_length=96,
        optim={"lr": 2e-4}, quality_sample=32,
    )
    jobs = {v: client.jobs.create(variant=v, metadata={"demo": "1"}, **common) for v in ("offline", "offline+humanline")}
    for variant, job in jobs.items():
        print(f"\n{variant}: job {job.id}")
        done = client.jobs.wait(job.id, progress=True, timeout=1800)
        print(f"  status: {done.status}" + (f" ({done.error})" if done.error else ""))
        if done.status != "succeeded":
            worker.stop()
            return 1

    print(f"\n{'variant':<20}{'loss':>8}{'margin':>9}{'clamped':>9}  checkpoints")
    for variant, job in jobs.items():
        last = list(client.jobs.metrics(job.id))[-1].values
        steps = [c.step for c in client.jobs.checkpoints(job.id)]
        print(f"{variant:<20}{last['loss']:>8.4f}{last.get('rewards/margins', 0):>9.4f}"
              f"{last.get('clamp_frac', 0):>9.3f}  steps {steps}")
    print("(humanline scores each step against the policy of the step before, so its loss stays\n"
          " near log 2 and its margin near 0 by design; compare variants by evaluation, not loss)")
    print(f"\nObjects (checkpoints, final models): {DEMO / 'objects'}")
    print(f"Run directories (metrics.jsonl, events.jsonl, data_quality.json): {DEMO / 'work'}")
    print(f"Database: {DEMO / 'humanline.db'}   wall-clock: {time.time() - t0:.0f} s")
    worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
