"""A stand-in for `python -m trainer` that speaks the run-directory protocol (contract.runs)
without torch, for scheduling and stop tests: seconds instead of minutes per job.

Environment: LOAD_SLEEP (seconds before `started`: loading the model), STEPS, SLEEP (per
step), LOG_EVERY (a metrics line every N steps), IGNORE_STOP (1: never looks at STOP). At a
STOP it checkpoints the step it is at, says `stopped` and exits 3; at the end it checkpoints
the last step and exits 0. Used as TRAINER_PYTHON (a shell script: argv is
`-m trainer run SPEC --out RUN_DIR --no-progress`).

Memory (issue 25): it trains with GRAD_ACCUM micro-batches of MICRO_BATCH examples (default
1 and 8), or those of the RUN_DIR/micro_batch.json it finds at start, and says which in its
`started` event (as the trainer does: the test reads what each attempt found there). With
FITS=N, a micro-batch of more than N examples runs out of memory at step 1 as several
processes do: micro_batch.json with the micro-batch halved, an `out_of_memory` event (unless
OOM_EVENT=0), exit OOM_CODE (default 4, EXIT_OUT_OF_MEMORY; accelerate launch exits 1).
"""

from __future__ import annotations

from pathlib import Path

SCRIPT = r"""#!/bin/sh
run="$6"
event() {
    printf '{"time": 0, "kind": "%s", "message": "%s", "data": {"step": %s}}\n' \
        "$1" "$2" "$3" >> "$run/events.jsonl"
}
checkpoint() {
    mkdir -p "$run/checkpoints/step-$1.tmp"
    printf '{"step": %s, "world_size": 1}' "$1" > "$run/checkpoints/step-$1.tmp/state.json"
    n=$(wc -c < "$run/checkpoints/step-$1.tmp/state.json")  # committed: the manifest, last
    printf '{"version": 1, "files": [{"path": "state.json", "size": %s}]}' $n \
        > "$run/checkpoints/step-$1.tmp/_COMPLETE"
    mv "$run/checkpoints/step-$1.tmp" "$run/checkpoints/step-$1"
    event checkpoint "checkpoint at step $1" "$1"
}
field() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$run/micro_batch.json"; }
accum="${GRAD_ACCUM:-1}"; micro="${MICRO_BATCH:-8}"
if [ -e "$run/micro_batch.json" ]; then accum=$(field grad_accum); micro=$(field micro_batch); fi
sleep "${LOAD_SLEEP:-0}"
printf '{"time": 0, "kind": "started", "message": "go", "data": {"total_steps": %s, ' "$STEPS" \
    >> "$run/events.jsonl"
printf '"grad_accum": %s, "micro_batch": %s, "activation_checkpointing": true, ' \
    "$accum" "$micro" >> "$run/events.jsonl"
printf '"compile": false, "memory_available_gib": 79.2, "memory_estimate_gib": 61.5}}\n' \
    >> "$run/events.jsonl"
step=1
while [ "$step" -le "$STEPS" ]; do
    sleep "${SLEEP:-0}"
    if [ -n "$FITS" ] && [ "$micro" -gt "$FITS" ]; then
        oom=$(printf '{"grad_accum": %s, "micro_batch": %s, "step": %s}' \
            $((accum * 2)) $((micro / 2)) "$step")
        printf '%s' "$oom" > "$run/micro_batch.json"
        if [ "${OOM_EVENT:-1}" = 1 ]; then
            printf '{"time": 0, "kind": "out_of_memory", "message": "oom", "data": %s}\n' \
                "$oom" >> "$run/events.jsonl"
        fi
        echo "torch.OutOfMemoryError: CUDA out of memory" >&2
        exit "${OOM_CODE:-4}"
    fi
    if [ $((step % ${LOG_EVERY:-1})) -eq 0 ]; then
        printf '{"step": %s, "time": 0, "loss": 0.69}\n' "$step" >> "$run/metrics.jsonl"
    fi
    if [ -e "$run/STOP" ] && [ "${IGNORE_STOP:-0}" != 1 ] && [ "$step" -lt "$STEPS" ]; then
        checkpoint "$step"
        event stopped "stopped at step $step on request" "$step"
        exit 3
    fi
    step=$((step + 1))
done
checkpoint "$STEPS"
exit 0
"""


def install(directory: Path) -> Path:
    path = directory / "fake-trainer"
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return path
