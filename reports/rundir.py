"""A job report from a trainer run directory (`python -m trainer run` output): metrics.jsonl,
events.jsonl, data_quality.json, result.json and the last checkpoint's spec.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from reports.job import build_job_report, to_epoch


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


def load_run_dir(
    run_dir: str | Path, evaluations: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """build_job_report over a trainer run directory (`python -m trainer run` output)."""
    run = Path(run_dir)
    metrics = _jsonl(run / "metrics.jsonl")
    events = _jsonl(run / "events.jsonl")
    dq = (
        json.loads((run / "data_quality.json").read_text())
        if (run / "data_quality.json").is_file()
        else None
    )
    result = (
        json.loads((run / "result.json").read_text()) if (run / "result.json").is_file() else None
    )
    spec = None
    ckpts = (
        sorted((run / "checkpoints").glob("step-*/spec.json"))
        if (run / "checkpoints").is_dir()
        else []
    )
    if ckpts:
        spec = json.loads(ckpts[-1].read_text())
    spec = spec or {}
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
    variant = spec.get("data_source", "offline") + ("+humanline" if spec.get("humanline") else "")
    objective = spec.get("objective")
    times = [t for e in events if (t := to_epoch(e.get("time"))) is not None]
    job = {
        "id": run.name,
        "status": (result or {}).get("status", "running"),
        "objective": objective.get("name") if isinstance(objective, dict) else objective,
        "variant": variant,
        "base_model": spec.get("base_model"),
        "created_at": min(times) if times else None,
        "finished_at": max(times) if result and times else None,
        "result": result,
    }
    return build_job_report(
        job=job,
        spec=spec,
        metrics=metrics,
        events=events,
        data_quality=dq,
        evaluations=evaluations,
        training_file=training_file,
    )
