"""A trainer run directory (`python -m trainer run` output) read as the inputs of a job report
(reports.job.build_job_report; reports.job.load_run_dir joins the two): metrics.jsonl,
events.jsonl, data_quality.json, result.json and the last checkpoint's spec.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from contract.runs import (
    CHECKPOINT_SPEC_FILE,
    CHECKPOINTS_DIR,
    DATA_QUALITY_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    RESULT_FILE,
    checkpoint_step,
)
from contract.spec import variant_of
from reports.times import to_epoch


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written when we read
    return out


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _last_checkpoint_spec(run: Path) -> dict[str, Any]:
    """The spec.json of the newest complete checkpoint (by step: step-10 is newer than step-9)."""
    root = run / CHECKPOINTS_DIR
    steps: dict[int, Path] = {}
    for path in root.iterdir() if root.is_dir() else ():
        if (step := checkpoint_step(path.name)) is not None:  # not step-N.tmp (being written)
            steps[step] = path
    for step in sorted(steps, reverse=True):
        if (spec := _read_json(steps[step] / CHECKPOINT_SPEC_FILE)) is not None:
            return spec
    return {}


def read_run_dir(run_dir: str | Path) -> dict[str, Any]:
    """The keyword arguments of build_job_report (all but `evaluations`) for a run directory."""
    run = Path(run_dir)
    metrics = _jsonl(run / METRICS_FILE)
    events = _jsonl(run / EVENTS_FILE)
    dq = _read_json(run / DATA_QUALITY_FILE)
    result = _read_json(run / RESULT_FILE)
    spec = _last_checkpoint_spec(run)
    training_file = None
    data_path = Path(str(spec.get("training_file") or ""))
    if spec.get("training_file") and data_path.is_file():
        raw = data_path.read_bytes()
        training_file = {
            "id": str(data_path),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw),
            "records": sum(1 for line in raw.splitlines() if line.strip()),
        }
    objective = spec.get("objective")
    times = [t for e in events if (t := to_epoch(e.get("time"))) is not None]
    job = {
        "id": run.name,
        "status": (result or {}).get("status", "running"),
        "objective": objective.get("name") if isinstance(objective, dict) else objective,
        "variant": variant_of(spec),
        "base_model": spec.get("base_model"),
        "created_at": min(times) if times else None,
        "finished_at": max(times) if result and times else None,
        "result": result,
    }
    return {
        "job": job,
        "spec": spec,
        "metrics": metrics,
        "events": events,
        "data_quality": dq,
        "training_file": training_file,
    }
