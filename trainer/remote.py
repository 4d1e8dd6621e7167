"""A rank that shares no disk with the worker: its spec and data come from the object store, and
rank 0's run log goes back there (DESIGN.md §5, docs/deploy.md).

    python -m trainer run s3://B/T/J/run/attempt-2/spec.json --out /scratch/run \
        --checkpoints s3://B/T/J/ --final s3://B/T/J/final/ --runlog s3://B/T/J/run/attempt-2/

* `localize_spec`: the spec (a URL or a path) is read; a `training_file` that is a URL is
  downloaded once into the rank's scratch directory (written under a temporary name, then
  renamed, so the ranks of one node that share the scratch never read half a file) and the
  spec handed to the trainer names the local copy.
* `RunLogMirror`: on global rank 0 a thread copies the run files (contract.runs.RUN_LOG_FILES)
  to the run-log URL every `every_s` seconds and once more at exit, and writes
  HEARTBEAT_FILE = {"time", "step"} (the last logged step). Each object is replaced whole, so a
  reader sees some complete earlier version of every file, never a torn one. The control plane
  (worker.reconcile) reads the same files the single-node worker tails in the run directory.

URLs go through fsspec (s3:// by s3fs): credentials and endpoint come from the standard AWS
environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, and
AWS_ENDPOINT_URL_S3 for a store that is not AWS, e.g. SeaweedFS or MinIO). fsspec is imported
only for a URL, as in trainer.ckptio.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from contract.runs import HEARTBEAT_FILE, METRICS_FILE, RUN_LOG_FILES
from trainer import ckptio

log = logging.getLogger("humanline.trainer")

MIRROR_EVERY_S = 5.0


def localize_spec(spec_ref: str, scratch: Path) -> Path:
    """A local spec file the trainer can run: `spec_ref` itself when it is a local path whose
    data is local, else a copy in `scratch` whose `training_file` names a local download."""
    if not ckptio.is_url(spec_ref) and not _data_is_url(Path(spec_ref)):
        return Path(spec_ref)
    scratch.mkdir(parents=True, exist_ok=True)
    raw = ckptio.read_bytes(spec_ref)
    name = str(spec_ref).rstrip("/").rsplit("/", 1)[-1] or "spec.json"
    doc = json.loads(raw) if name.endswith(".json") else _yaml(raw)
    data = doc.get("training_file")
    if isinstance(data, str) and ckptio.is_url(data):
        doc["training_file"] = str(_download_once(data, scratch / "data"))
    local = scratch / "spec.json"
    _write_atomic(local, json.dumps(doc, indent=2).encode())
    return local


def _yaml(raw: bytes) -> dict:
    import yaml

    return yaml.safe_load(raw)


def _data_is_url(spec_path: Path) -> bool:
    try:
        text = spec_path.read_text()
        doc = json.loads(text) if spec_path.suffix == ".json" else _yaml(text.encode())
    except (OSError, ValueError):
        return False  # the spec's own validation reports it
    return isinstance(doc, dict) and ckptio.is_url(str(doc.get("training_file", "")))


def _download_once(url: str, directory: Path) -> Path:
    """`url` in `directory` (kept if already complete: the ranks of one node share it)."""
    target = directory / url.rstrip("/").rsplit("/", 1)[-1]
    if target.exists():
        return target
    _write_atomic(target, ckptio.read_bytes(url))
    return target


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def last_step(out_dir: Path) -> int | None:
    """The step of the last complete line of METRICS_FILE (None before the first)."""
    path = out_dir / METRICS_FILE
    if not path.exists():
        return None
    step = None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.endswith("\n") and line.strip():
                try:
                    step = int(json.loads(line)["step"])
                except (ValueError, KeyError, TypeError):
                    continue
    return step


class RunLogMirror:
    """Copies rank 0's run files to `url` from a daemon thread (module docstring)."""

    def __init__(self, out_dir: Path, url: str, every_s: float = MIRROR_EVERY_S):
        self.out_dir, self.url, self.every_s = Path(out_dir), str(url), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runlog-mirror", daemon=True)
        self._sizes: dict[str, int] = {}

    def __enter__(self) -> RunLogMirror:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(30.0, self.every_s * 2))
        self.sync()  # the last word: result.json and the final lines

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sync()
            except Exception as exc:  # a store hiccup must not kill training; next tick retries
                log.warning("run log mirror: %s", exc)

    def sync(self) -> None:
        """Upload every run file that changed since the last sync, then the heartbeat."""
        for name in RUN_LOG_FILES:
            path = self.out_dir / name
            if not path.is_file():
                continue
            data = path.read_bytes()
            if name.endswith(".jsonl"):  # only whole lines: a line being written waits
                data = data[: data.rfind(b"\n") + 1]
            if self._sizes.get(name) == len(data) and not name.endswith(".json"):
                continue
            ckptio.write_bytes(ckptio.join(self.url, name), data)
            self._sizes[name] = len(data)
        beat = {"time": time.time(), "step": last_step(self.out_dir)}
        ckptio.write_bytes(ckptio.join(self.url, HEARTBEAT_FILE), json.dumps(beat).encode())
