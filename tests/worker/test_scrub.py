"""Team-visible fields carry no server path, hostname or pid (DESIGN.md §6, issue 14 #11):
worker.scrub by hand, then jobs whose trainer leaks them, read back through the API."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import sysconfig
from pathlib import Path

import pytest

from models.leases import public_owner
from worker.runner import Runner
from worker.scrub import TAIL_BYTES, Server, error_tail, scrub, scrub_text, this_server

ATTEMPT = "/srv/work/job-1/attempt-1-abcd1234"
SERVER = Server(
    roots=(ATTEMPT, "/opt/venv/lib/python3.12/site-packages", "/usr/lib/python3.12"),
    hostnames=("gpu-node-17.internal", "gpu-node-17"),
    pids=(48213, 48240, 7),
)


# --- the functions, by hand ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"no such file: '{ATTEMPT}/run/step-2'", "no such file: 'run/step-2'"),
        (f"cwd {ATTEMPT}.", "cwd .."),  # the directory itself; the sentence's full stop stays
        (
            'File "/opt/venv/lib/python3.12/site-packages/transformers/modeling_utils.py", line 9',
            'File "transformers/modeling_utils.py", line 9',
        ),
        ('File "/usr/lib/python3.12/json/decoder.py", line 3', 'File "json/decoder.py", line 3'),
        ("cache /root/.cache/huggingface/hub/x/config.json", "cache .../config.json"),
        ("PYTHONPATH=/a/b:/c/d", "PYTHONPATH=.../b:.../d"),
        ("open file:///etc/secrets/key", "open .../key"),
        # not paths: a URL's path, fractions, relative paths, our own placeholders
        ("judge https://api.example.com/v1/chat", "judge https://api.example.com/v1/chat"),
        ("ratio 1/2 and a/b and ./x and .../y", "ratio 1/2 and a/b and ./x and .../y"),
    ],
)
def test_absolute_paths_become_relative_to_their_root_or_their_name(text, expected):
    assert scrub_text(text, SERVER) == expected


def test_the_host_name_and_pids_are_replaced_as_words():
    text = (
        "connect to gpu-node-17.internal:29500 from gpu-node-17 failed (pid: 7); "
        "worker 48213, child pid=48240; step 482130 of 7 on gpu-node-170"
    )
    assert scrub_text(text, SERVER) == (
        "connect to <host>:29500 from <host> failed (pid: <pid>); "
        "worker <pid>, child pid=<pid>; step 482130 of 7 on gpu-node-170"
    )


def test_scrub_walks_json_drops_host_pid_and_path_keys_and_is_idempotent():
    value = {
        "message": f"ValueError: bad row in {ATTEMPT}/file-1 on gpu-node-17",
        "host": "gpu-node-17",
        "hostname": "gpu-node-17",
        "pid": 48213,
        "ppid": 1,
        "path": f"{ATTEMPT}/run",
        "data": {"step": 3, "files": [f"{ATTEMPT}/run/a.json", 2.5, None, True]},
    }
    once = scrub(value, SERVER)
    assert once == {
        "message": "ValueError: bad row in file-1 on <host>",
        "data": {"step": 3, "files": ["run/a.json", 2.5, None, True]},
    }
    assert scrub(once, SERVER) == once
    assert scrub(None, SERVER) is None


def test_error_tail_keeps_the_exception_and_the_lines_before_it_within_a_kilobyte():
    frames = "".join(
        f'  File "/opt/venv/lib/python3.12/site-packages/pkg/m{i}.py", line {i}\n'
        f"    call_{i}({'x' * 150})\n"
        for i in range(40)
    )
    stderr = (
        "Loading: 10%\rLoading: 100%\r\nTraceback (most recent call last):\n"
        f"{frames}ValueError: bad record 7 in {ATTEMPT}/file-1 (pid 48213)\n"
    )
    tail = error_tail(stderr, SERVER)
    assert tail.endswith("ValueError: bad record 7 in file-1 (pid <pid>)")
    assert len(tail.encode()) <= TAIL_BYTES and 'File "pkg/m39.py", line 39' in tail
    assert "/opt/venv" not in tail and "Loading" not in tail
    # one exception line longer than the bound: its start, the type and message, is kept
    long = error_tail("x\nRuntimeError: " + "é" * 2000 + "\n", SERVER)
    assert long.startswith("RuntimeError: ") and len(long.encode()) <= TAIL_BYTES


def test_this_server_knows_this_machine():
    here = this_server(Path(ATTEMPT), pids=[None, 48240])
    assert ATTEMPT in here.roots and sysconfig.get_paths()["purelib"] in here.roots
    assert os.getpid() in here.pids and 48240 in here.pids
    assert socket.gethostname() in here.hostnames or socket.gethostname() == "localhost"
    assert "/" not in here.roots


def test_events_name_a_lease_owner_by_its_random_part_only():
    assert public_owner("gpu-node-17:48213:5f2a9c1e") == "5f2a9c1e"
    assert public_owner(None) is None


# --- jobs whose trainer leaks them, read through the API ------------------------------------

# A stand-in for `python -m trainer run SPEC --out RUN_DIR --no-progress` (argv $4 and $6)
# that says everything a crashing trainer could: its working directory, run directory, the
# installed packages' paths, the host name and pids, in an event, a checkpoint and stderr.
LEAKY_TRAINER = """#!/bin/sh
run="$6"
host="$(hostname)"
data="$(sed -n 's/.*"training_file": "\\([^"]*\\)".*/\\1/p' "$4")"
printf '{"time": 0, "kind": "started", "message": "go", "data": {"total_steps": 1}}\\n' \
    >> "$run/events.jsonl"
printf '{"time": 0, "kind": "note", "message": "cache at %s on %s (pid %s)", ' "$PWD" "$host" "$$" \
    >> "$run/events.jsonl"
printf '"data": {"host": "%s", "pid": %s, "path": "%s", "dir": "%s", "step": 1}}\\n' \
    "$host" "$$" "$run" "$PWD/run" >> "$run/events.jsonl"
printf '{"step": 1, "time": 0, "loss": 0.69}\\n' >> "$run/metrics.jsonl"
mkdir -p "$run/checkpoints/step-1.tmp"
cp "$4" "$run/checkpoints/step-1.tmp/spec.json"   # as trainer.checkpoint.save writes the spec
printf '{"step": 1, "world_size": 1}' > "$run/checkpoints/step-1.tmp/state.json"
a=$(wc -c < "$run/checkpoints/step-1.tmp/spec.json")
b=$(wc -c < "$run/checkpoints/step-1.tmp/state.json")
printf '{"version": 1, "files": [{"path": "spec.json", "size": %s}, ' $a \\
    > "$run/checkpoints/step-1.tmp/_COMPLETE"
printf '{"path": "state.json", "size": %s}]}' $b >> "$run/checkpoints/step-1.tmp/_COMPLETE"
mv "$run/checkpoints/step-1.tmp" "$run/checkpoints/step-1"
printf '{"time": 0, "kind": "checkpoint", "message": "at step 1", ' >> "$run/events.jsonl"
printf '"data": {"step": 1, "path": "%s"}}\\n' "$run/checkpoints/step-1" >> "$run/events.jsonl"
{
    printf 'Loading: 100%%\\rTraceback (most recent call last):\\n'
    printf '  File "%s/trainer/train.py", line 177, in __init__\\n' "$SITE"
    printf '  File "%s/run/x.py", line 3, in <module>\\n' "$PWD"
    printf '[W socket.cpp:464] [c10d] connect to %s:29500 failed; worker pid %s, child pid %s\\n' \
        "$host" "$WORKER_PID" "$$"
    printf 'ValueError: record 7 of %s/%s is not a preference pair (host %s, pid %s)\\n' \
        "$PWD" "$data" "$host" "$$"
} >&2
exit 1
"""


def _leaks(text: str, local, pids: list[int]) -> list[str]:
    """What of this server `text` names: its directories, its host, the pids."""
    work = Path(local.settings.WORKER_DIR)
    found = [d for d in {str(work), str(work.resolve()), sys.prefix} if d in text]
    found += [m.group(0) for m in re.finditer(r"(?<![\w.])/(?:tmp|srv|root|home|work)/\S*", text)]
    host = socket.gethostname()
    if re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", text):
        found.append(host)
    found += [str(p) for p in pids if re.search(rf"(?<![\w.]){p}(?![\w.])", text)]
    return found


def test_a_crashing_trainer_leaks_no_path_host_or_pid_to_the_team(
    local, api, tmp_path, monkeypatch
):
    script = tmp_path / "leaky-python"
    script.write_text(LEAKY_TRAINER)
    script.chmod(0o755)
    monkeypatch.setenv("SITE", sysconfig.get_paths()["purelib"])
    monkeypatch.setenv("WORKER_PID", str(os.getpid()))
    settings = local.settings.model_copy(
        update={"TRAINER_PYTHON": str(script), "KEEP_RUN_DIRS": True}
    )
    job_id = local.make_job(max_steps=1)
    assert Runner(settings, local.sessions, local.store).run(job_id) == "failed"

    # The leaks are real: the full stderr, for operators, names the dirs, the host and the pid.
    [stderr_log] = Path(settings.WORKER_DIR).glob(f"{job_id}/attempt-*/stderr.log")
    full = stderr_log.read_text()
    trainer_pid = int(re.findall(r"child pid (\d+)", full)[0])
    pids = [os.getpid(), trainer_pid]
    assert str(stderr_log.parent) in full and f"pid {trainer_pid}" in full
    assert socket.gethostname() in full

    job = api.get(f"/v1/jobs/{job_id}").json()
    events = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    stream = api.get(f"/v1/jobs/{job_id}/events/stream").text  # ends: the job is terminal
    report = api.get(f"/v1/jobs/{job_id}/report").text
    for name, body in [("job", json.dumps(job)), ("events", json.dumps(events)),
                       ("stream", stream), ("report", report)]:  # fmt: skip
        assert _leaks(body, local, pids) == [], name

    # Still useful: the exception's type and message, and where it was raised.
    error = job["error"]
    assert error["type"] == "trainer_error" and error["exit_code"] == 1
    assert error["message"].startswith(
        "the trainer exited with code 1: ValueError: record 7 of file-"
    ), error["message"]
    assert "is not a preference pair (host <host>, pid <pid>)" in error["message"]
    assert 'File "trainer/train.py", line 177' in error["stderr_tail"]
    assert len(error["stderr_tail"].encode()) <= TAIL_BYTES
    note = next(e for e in events if e["data"].get("trainer_kind") == "note")
    assert note["message"] == "cache at . on <host> (pid <pid>)"
    assert note["data"] == {"dir": "run", "step": 1, "attempt": 1, "trainer_kind": "note"}
    running = next(e for e in events if e["data"].get("to") == "running")
    assert ":" not in running["data"]["worker"]  # the lease owner's random part only

    # The spec the trainer got, and wrote into its checkpoint, is the team's own.
    r = api.get(f"/v1/jobs/{job_id}/checkpoints/1/download", params={"file": "spec.json"})
    assert r.status_code == 200, r.text
    spec = r.json()
    assert spec["training_file"] == local.job(job_id).training_file_id
    assert _leaks(r.text, local, pids) == [] and '"/' not in r.text


def test_a_real_trainers_checkpoint_and_model_name_no_server_path(local, api):
    """The real trainer reads the training file by the relative name the spec gives it and
    writes that spec into its checkpoints; neither they nor the exported model's text files
    (model card, adapter config, tokenizer files) name a server path."""
    job_id = local.make_job(max_steps=2, checkpoint_every=1)
    assert Runner(local.settings, local.sessions, local.store).run(job_id) == "succeeded"
    r = api.get(f"/v1/jobs/{job_id}/checkpoints/2/download", params={"file": "spec.json"})
    assert r.status_code == 200, r.text
    assert r.json()["training_file"] == local.job(job_id).training_file_id
    texts = {"spec.json": r.text}
    for key in local.store.list(""):
        if job_id in key and key.endswith((".json", ".md", ".txt")):
            texts[key] = local.store.get_bytes(key).decode()
    assert any(k.endswith("final/README.md") for k in texts), sorted(texts)
    assert any(k.endswith("final/tokenizer_config.json") for k in texts), sorted(texts)
    for name, text in texts.items():
        assert _leaks(text, local, [os.getpid()]) == [], name
