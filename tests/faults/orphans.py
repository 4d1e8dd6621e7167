"""Orphaned bytes, measured from the backend itself and the rows, independently of the
sweeper's code: everything physically stored (temporary files, and for S3 unfinished
multipart uploads, as "KEY#upload" with the bytes of their parts) minus what a row
references (a file's object, a checkpoint's prefix, a final model's prefix, a report)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from models.tables import Checkpoint, Evaluation, File, Job
from storage import LocalStore, S3Store
from worker.sweeper import sweep


def physical(store: Any) -> dict[str, int]:
    """Every object or temporary file in the backend, key -> bytes."""
    if isinstance(store, LocalStore):
        out = {}
        for dirpath, _, files in os.walk(store.root):
            for name in files:
                path = Path(dirpath) / name
                out[path.relative_to(store.root).as_posix()] = path.stat().st_size
        return out
    assert isinstance(store, S3Store)
    client, bucket = store._client, store.bucket
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        parts = client.list_parts(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
        out[up["Key"] + "#upload"] = sum(p["Size"] for p in parts.get("Parts", []))
    return out


def referenced(sessions: Any) -> tuple[set[str], set[str]]:
    """(keys, prefixes) the rows reference."""
    with sessions() as s:
        keys = set(s.scalars(select(File.object_key)))
        prefixes = set(s.scalars(select(Checkpoint.object_prefix)))
        for result in s.scalars(select(Job.result)):
            prefix = ((result or {}).get("final_model") or {}).get("prefix")
            if prefix:
                prefixes.add(prefix)
        for result in s.scalars(select(Evaluation.result)):
            keys.update(((result or {}).get("report") or {}).values())
    return keys, prefixes


def orphans(store: Any, sessions: Any) -> dict[str, int]:
    """Stored objects no row references, key -> bytes."""
    keys, prefixes = referenced(sessions)
    return {
        key: size
        for key, size in physical(store).items()
        if key not in keys and not any(key.startswith(p) for p in prefixes)
    }


def temp_bytes(store) -> int:
    """Bytes of temporary files (local) or unfinished multipart uploads (S3)."""
    return sum(
        size for key, size in physical(store).items()
        if key.startswith(".tmp/") or key.endswith("#upload")
    )  # fmt: skip


def sweep_later(sessions, store) -> dict:
    """Orphaned bytes (tests.faults.orphans: the backend itself against the rows) before and
    after one sweep run as if an hour had passed (the grace period protects young objects;
    nothing here writes any more)."""
    before = orphans(store, sessions)
    report = sweep(sessions, store, grace_seconds=3600, now=time.time() + 3601)
    after = orphans(store, sessions)
    return {
        "orphaned_bytes_before_sweep": sum(before.values()),
        "orphaned_bytes_after_sweep": sum(after.values()),
        "orphans_before": sorted(before),
        "orphans_after": sorted(after),
        "sweep": report.as_dict(),
    }
