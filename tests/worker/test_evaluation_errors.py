"""An evaluation's failure and judge, as the worker sees them: the limits a training job's
failure has (STDERR_TAIL_BYTES, MAX_MESSAGE_CHARS) and the judge URL the API admitted. (The
evaluation itself is tested in tests/evaluation.)"""

from __future__ import annotations

from pathlib import Path

from models.tables import Evaluation
from tests.fixtures.rows import add_file
from worker.attempt import MAX_MESSAGE_CHARS, crash_error
from worker.evaluate import _prepare, run_evaluation

REPO = Path(__file__).resolve().parents[2]
DATA = {
    "math": (REPO / "examples" / "data" / "math_eval_small.jsonl").read_bytes(),
    "instruction": (REPO / "examples" / "data" / "instruction_eval_small.jsonl").read_bytes(),
}
# Stands in for `python -m trainer.evaluation run ...`: a traceback on stderr, no error.json.
CRASH = """#!/bin/sh
i=1
while [ "$i" -le 8 ]; do
    echo "  File \\"trainer/evaluation/run.py\\", line $i, in frame_number_$i" >&2
    i=$((i + 1))
done
echo "ValueError: boom" >&2
exit 1
"""


def _evaluation(local, kind: str = "math", **config) -> str:
    with local.sessions() as s:
        f = add_file(s, local.store, local.team_id, DATA[kind], purpose="eval", fmt=f"eval_{kind}")
        row = Evaluation(
            team_id=local.team_id, base_model="tiny-llama", file_id=f.id, kind=kind, config=config
        )
        s.add(row)
        s.commit()
        return row.id


def test_an_evaluations_stderr_tail_follows_the_setting(local, tmp_path):
    script = tmp_path / "crash"
    script.write_text(CRASH)
    script.chmod(0o755)
    settings = local.settings.model_copy(
        update={"TRAINER_PYTHON": str(script), "STDERR_TAIL_BYTES": 100}
    )
    eid = _evaluation(local)
    assert run_evaluation(eid, local.sessions, local.store, settings) == "failed"
    with local.sessions() as s:
        error = s.get(Evaluation, eid).error
    assert error["type"] == "evaluation_error" and error["exit_code"] == 1
    assert error["message"] == "the evaluation process exited with code 1: ValueError: boom"
    tail = error["stderr_tail"]
    assert tail.endswith("ValueError: boom") and "frame_number_7" in tail
    assert len(tail.encode()) <= 100 and "frame_number_1" not in tail  # the last 100 bytes


def test_the_judge_url_is_the_one_the_api_admitted(local, tmp_path):
    """The API strips a judge URL's surrounding whitespace and trailing '/'
    (contract.evaluation); the worker's allow-list check must see the same URL."""
    url = "http://judge.example:8000/v1"
    settings = local.settings.model_copy(update={"EVAL_JUDGE_BASE_URLS": url})
    judge = {"type": "openai", "base_url": f" {url}/ \n", "model": "judge-model"}
    eid = _evaluation(local, "instruction", judge=judge)
    with local.sessions() as s:
        row = s.get(Evaluation, eid)
        config, _ = _prepare(s, row, local.store, settings, tmp_path)
    assert config["judge"]["base_url"] == url


def test_a_trainer_error_message_keeps_up_to_max_message_chars(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text("Traceback (most recent call last):\nValueError: " + "x" * 5000 + "\n")
    message = crash_error("the trainer", "trainer_error", path, 1, 8000)["message"]
    assert message.startswith("the trainer exited with code 1: ValueError: xxx")
    assert 1000 < len(message) <= MAX_MESSAGE_CHARS  # the exception line as the tail keeps it
