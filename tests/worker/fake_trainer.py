"""A stand-in for `python -m trainer` that speaks the run-directory protocol (contract.runs)
without torch, for scheduling and stop tests: seconds instead of minutes per job.

Environment: LOAD_SLEEP (seconds before `started`: loading the model), STEPS, SLEEP (per
step), LOG_EVERY (a metrics line every N steps), IGNORE_STOP (1: never looks at STOP). At a
STOP it checkpoints the step it is at, says `stopped` and exits 3; at the end it checkpoints
the last step and exits 0. Used as TRAINER_PYTHON (a shell script: argv is
`-m trainer run SPEC --out RUN_DIR --no-progress`).
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
    mv "$run/checkpoints/step-$1.tmp" "$run/checkpoints/step-$1"
    event checkpoint "checkpoint at step $1" "$1"
}
sleep "${LOAD_SLEEP:-0}"
printf '{"time": 0, "kind": "started", "message": "go", "data": {"total_steps": %s}}\n' \
    "$STEPS" >> "$run/events.jsonl"
step=1
while [ "$step" -le "$STEPS" ]; do
    sleep "${SLEEP:-0}"
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
