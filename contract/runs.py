"""The run-directory protocol: how a worker and a trainer process talk (DESIGN.md §5).

A worker starts `python -m trainer run SPEC --out RUN_DIR [--resume]` and watches RUN_DIR; the
trainer knows nothing of the service. Everything they share is named here, once.

    RUN_DIR/metrics.jsonl        one line per logged step ({"step", "time", ...values})
    RUN_DIR/events.jsonl         one line per event ({"time", "kind", "message", "data"})
    RUN_DIR/data_quality.json    the training data's quality summary (written once)
    RUN_DIR/result.json          the trainer's own summary at the end
    RUN_DIR/checkpoints/step-N/  a checkpoint (trainer.checkpoint: DCP shards written by every
                                 rank), committed by COMPLETE_MARKER, which rank 0 writes last
                                 (a manifest {"version": MANIFEST_VERSION, "files": [{"path",
                                 "size"}]}); a step dir without it is torn and never read. Its
                                 state.json holds the format and the world size it was saved
                                 with, spec.json the job's spec; trainer.checkpoint.read_weights
                                 reads its trainable weights (what an evaluation loads). Format 1
                                 dirs (weights.safetensors, optimizer.pt, rank-R.pt) still load.
    RUN_DIR/final/               the exported model of a finished run
    RUN_DIR/heartbeat.json       multi-node only, in the --runlog URL (trainer.remote)
    RUN_DIR/STOP                 dropped by the worker: checkpoint at the next step boundary
                                 and exit with EXIT_STOPPED

Exit codes: EXIT_OK (0) trained to the end; EXIT_INVALID_SPEC (2) the spec or its data is
invalid (not worth retrying); EXIT_STOPPED (3) stopped at a STOP request; EXIT_OUT_OF_MEMORY
(4) a multi-process run ran out of memory (retry with the micro-batch its MICRO_BATCH_FILE
names); anything else a crash.

An evaluation (`python -m trainer.evaluation run --config C --out DIR`) writes
progress.json as it goes, then result.json and report.html, or error.json ({"type",
"message"}) and exits with one of the EVAL_EXIT_* codes.
"""

from __future__ import annotations

import re

# --- training ----------------------------------------------------------------------------------
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
DATA_QUALITY_FILE = "data_quality.json"
RESULT_FILE = "result.json"
STOP_FILE = "STOP"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_STATE_FILE = "state.json"
CHECKPOINT_WEIGHTS_FILE = "weights.safetensors"  # format 1 checkpoints only
CHECKPOINT_FORMAT = 2  # state.json "format": DCP shards (format 1 wrote no "format")
# The commit marker of a checkpoint or export directory, locally and in the store: written
# last, holding the manifest {"version": MANIFEST_VERSION, "files": [{"path", "size"}]}
COMPLETE_MARKER = "_COMPLETE"
MANIFEST_VERSION = 1
CHECKPOINT_SPEC_FILE = "spec.json"
FINAL_DIR = "final"
CHECKPOINT_DIR_RE = re.compile(r"step-(0|[1-9][0-9]*)")

# A multi-node run (trainer.remote): rank 0 mirrors these run files to its --runlog URL, and
# HEARTBEAT_FILE ({"time", "step"}: the last logged step) with every mirror.
HEARTBEAT_FILE = "heartbeat.json"
RUN_LOG_FILES = (METRICS_FILE, EVENTS_FILE, DATA_QUALITY_FILE, RESULT_FILE)

# Seconds any collective may wait for the other ranks before it fails (default 1800): what
# turns a lost node into a clear error instead of a hang. Set by the ClusterTrainingRuntime.
COLLECTIVE_TIMEOUT_ENV = "HUMANLINE_COLLECTIVE_TIMEOUT_S"

EXIT_OK, EXIT_INVALID_SPEC, EXIT_STOPPED = 0, 2, 3
# Out of memory with several processes: retry from the last checkpoint with half the
# micro-batch (the trainer wrote MICRO_BATCH_FILE; one process halves in place instead).
EXIT_OUT_OF_MEMORY = 4
MICRO_BATCH_FILE = "micro_batch.json"
OUT_OF_MEMORY_EVENT = "out_of_memory"  # the trainer's: split finer (fields grad_accum, micro_batch)

# Trainer event kinds the worker copies into the job's events as they are. Any other kind is
# recorded as `log` (its own kind in data.trainer_kind), except the trainer's `checkpoint`
# (saved locally), which the worker records itself once the checkpoint is in the store.
COPIED_EVENT_KINDS = frozenset(
    {
        "data",
        "warning",
        "started",
        "resumed",
        "stopped",
        "finished",
        "progress",
        "round",
        OUT_OF_MEMORY_EVENT,
    }
)
CHECKPOINT_EVENT = "checkpoint"


def checkpoint_dir_name(step: int) -> str:
    """`step-N`: the name of a checkpoint directory under CHECKPOINTS_DIR."""
    return f"step-{step}"


def checkpoint_step(name: str) -> int | None:
    """N for a checkpoint directory `step-N` (None for anything else: `.tmp` dirs); whether
    it is complete is its COMPLETE_MARKER's to say."""
    m = CHECKPOINT_DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


# --- evaluation --------------------------------------------------------------------------------
EVAL_PROGRESS_FILE = "progress.json"
EVAL_RESULT_FILE = "result.json"
EVAL_REPORT_FILE = "report.html"
EVAL_ERROR_FILE = "error.json"
EVAL_EXIT_OK, EVAL_EXIT_ERROR, EVAL_EXIT_INVALID, EVAL_EXIT_JUDGE = 0, 1, 2, 3
EVAL_ERROR_TYPE = "evaluation_error"  # error.json's type for EVAL_EXIT_ERROR and any crash
EVAL_EXIT_TYPES = {
    EVAL_EXIT_ERROR: EVAL_ERROR_TYPE,
    EVAL_EXIT_INVALID: "invalid_evaluation",
    EVAL_EXIT_JUDGE: "judge_error",
}
JUDGE_API_KEY_ENV = "HUMANLINE_JUDGE_API_KEY"  # the judge's key reaches the child only here
