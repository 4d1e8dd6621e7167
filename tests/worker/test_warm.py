"""worker.warm: a child forked from the warm process is what a cold launch is (argv, cwd,
environment, its own session, output in the attempt's files, exit code), is killed with its
group, and an evaluation run warm gives the result it gives cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import worker.attempt
from models.tables import Evaluation
from tests.fixtures.rows import add_file
from tests.worker.test_evaluation_errors import _evaluation
from worker import warm
from worker.attempt import kill_group
from worker.evaluate import run_evaluation


def _start(tmp_path, *args: str, env: dict[str, str] | None = None) -> warm.WarmProcess:
    argv = [sys.executable, "-m", "tests.worker.warm_child", *args]
    return warm.start(argv, env=env or {"WARM_PROBE": "yes"}, cwd=tmp_path,
                      stdout=tmp_path / "out.log", stderr=tmp_path / "err.log",
                      deathsig=signal.SIGKILL)  # fmt: skip


def test_a_warm_child_is_what_a_cold_launch_is(tmp_path, monkeypatch):
    monkeypatch.setenv("WARM_OUTER", "the worker's")  # not in the launch's environment
    proc = _start(tmp_path, "report", "3")
    assert proc.wait(timeout=120) == 3 and proc.poll() == 3
    seen = json.loads((tmp_path / "out.log").read_text())
    assert seen["argv"] == ["report", "3"] and seen["name"] == "__main__"
    assert seen["cwd"] == str(tmp_path)
    assert seen["probe"] == "yes" and seen["outer"] is None  # the launch's environment only
    assert seen["stdin"] == ""  # /dev/null, as stdin=DEVNULL
    assert seen["pid"] == proc.pid and seen["sid"] == proc.pid == seen["pgrp"]  # own session
    assert (tmp_path / "err.log").read_text() == "a line on stderr\n"


def test_a_warm_child_and_its_group_are_killed(tmp_path):
    proc = _start(tmp_path, "sleep", str(tmp_path / "pids"))
    deadline = time.monotonic() + 120
    while not (tmp_path / "pids").exists() or not (tmp_path / "pids").read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    grandchild = int((tmp_path / "pids").read_text().split()[1])
    kill_group(proc)
    assert proc.poll() == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild):  # reaped by init once its parent is gone
        assert time.monotonic() < deadline, "the grandchild outlived the kill"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_only_this_interpreters_module_launches_run_warm():
    assert warm.can_start([sys.executable, "-m", "trainer.evaluation", "run"])
    assert not warm.can_start(["/bin/sh", "-m", "trainer.evaluation"])
    assert not warm.can_start([sys.executable, "script.py"])
    with pytest.raises(ValueError, match="-m MODULE"):
        warm.start(["/bin/sh", "-c", "true"], env={}, cwd=os.getcwd(), stdout=os.devnull,
                   stderr=os.devnull, deathsig=signal.SIGKILL)  # fmt: skip


@pytest.mark.slow
def test_an_evaluation_run_warm_gives_the_cold_result(local, monkeypatch):
    started: list[list[str]] = []

    def spy(argv, **kw):
        started.append(argv)
        return warm.start(argv, **kw)

    monkeypatch.setattr(worker.attempt, "start_warm", spy)
    results = {}
    for warm_start in (False, True):
        settings = local.settings.model_copy(update={"EVAL_WARM_START": warm_start})
        eid = _evaluation(local, max_items=4)
        assert run_evaluation(eid, local.sessions, local.store, settings) == "succeeded"
        with local.sessions() as s:
            results[warm_start] = s.get(Evaluation, eid).result
    assert len(started) == 1 and started[0][2] == "trainer.evaluation"  # the second one only
    assert results[True]["metrics"] == results[False]["metrics"]
    assert results[True]["generation"] == results[False]["generation"]


def test_a_warm_evaluations_invalid_data_fails_as_a_cold_one(local):
    settings = local.settings.model_copy(update={"EVAL_WARM_START": True})
    with local.sessions() as s:
        f = add_file(s, local.store, local.team_id, b'{"problem": "1+1="}\n', purpose="eval",
                     fmt="eval_math")  # fmt: skip
        row = Evaluation(team_id=local.team_id, base_model="tiny-llama", file_id=f.id,
                         kind="math", config={})  # fmt: skip
        s.add(row)
        s.commit()
        eid = row.id
    assert run_evaluation(eid, local.sessions, local.store, settings) == "failed"
    with local.sessions() as s:
        error = s.get(Evaluation, eid).error
    assert error["type"] == "invalid_evaluation" and error["exit_code"] == 2  # the child's own
    assert "line 1" in error["message"] and "got 'problem'" in error["message"]
