"""The CLI's last mile: `--spec` in YAML (errors name the file and the format), per-step
`progress` events on `--follow`, progress as plain log lines outside a terminal, metrics
with clock times and whole headers."""

from __future__ import annotations

import io
import json

import pytest

from humanline_client._progress import PlainProgress, make_progress
from humanline_client.resources._job_wait import Tracker
from humanline_client.types import Job, JobEvent


def test_jobs_create_spec_in_yaml(cli, train_file, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "base_model: tiny-llama   # as in the README\n"
        "objective: {name: kto, beta: 0.2}\n"
        "variant: offline+humanline\n"
        "humanline_params: {sync_every: 2}\n"
        "adapter: {kind: lora, r: 8}\n"
        "max_steps: 3\n"
    )
    job = json.loads(
        cli("jobs", "create", "--spec", str(spec), "--file", train_file, "--json").stdout
    )
    assert job["objective"] == "kto" and job["variant"] == "offline+humanline"
    assert job["spec"]["objective"]["beta"] == 0.2 and job["spec"]["adapter"]["r"] == 8
    assert job["spec"]["humanline_params"]["sync_every"] == 2 and job["spec"]["max_steps"] == 3


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "objective: {name: dpo\nseed: 1\n", "not valid YAML"),
        ("bad.json", '{"objective": "dpo",}', "not valid JSON"),
        ("list.yml", "- dpo\n", "expected a YAML mapping"),
        ("spec.txt", "objective: [dpo\n", "not valid JSON"),  # tried as JSON, then YAML
    ],
)
def test_a_bad_spec_file_is_named_with_its_format(cli, tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    result = cli("jobs", "create", "--spec", str(path), "--file", "file-x", ok=False)
    assert result.exit_code == 1 and result.stderr.startswith(f"error: --spec {path}: ")
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    if name == "spec.txt":
        assert "not valid YAML" in result.stderr


def test_follow_shows_progress_events(cli, client, train_file, driver):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(job.id, total_steps=4)
    data = {"phase": "training", "step": 2, "total_steps": 4, "loss": 0.5, "eta_s": 90}
    driver.event(job.id, "progress", "", **data)
    driver.event(job.id, "progress", "", phase="loading_model", step=0, total_steps=4)
    driver.finish(job.id)
    lines = cli("jobs", "events", job.id, "--follow").stdout.splitlines()
    assert any(line.endswith("progress: training step 2/4, loss 0.5, ETA 1:30") for line in lines)
    assert any(line.endswith("progress: loading model step 0/4") for line in lines)


def test_progress_events_drive_the_display_not_the_log():
    out = io.StringIO()
    display = make_progress(True, "job-1", file=out)  # not a terminal: plain log lines
    assert isinstance(display, PlainProgress) and display.every >= 5
    tracker = Tracker(display, Job(id="job-1", status="running", total_steps=10))
    tracker.event(JobEvent(seq=1, kind="progress", data={"phase": "loading_model", "step": 0}))
    tracker.event(
        JobEvent(
            seq=2, kind="progress", data={"step": 3, "total_steps": 10, "loss": 0.25, "eta_s": 75}
        )
    )
    display.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "job-1 running (loading model): step 0/10, loss -, ETA ?"
    assert lines[-1] == "job-1 running: step 3/10, loss 0.2500, ETA 1:15"
    assert not any("progress:" in line for line in lines)  # no event notes for progress
    assert make_progress(None, "job-1", file=io.StringIO()) is None  # SDK default: quiet


def test_jobs_wait_outside_a_terminal_logs_plain_lines(cli, client, train_file, driver):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.run(job.id, steps=3)
    result = cli("jobs", "wait", job.id)
    assert f"{job.id} succeeded: step 3/3, loss 0.2333, ETA" in result.stderr
    assert result.stdout.strip() == f"{job.id} succeeded"
    assert json.loads(cli("jobs", "wait", job.id, "--json").stdout)["status"] == "succeeded"


def test_metrics_show_times_and_whole_headers(cli, client, train_file, driver):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(job.id)
    long_names = {f"rewards_margin_of_component_number_{i}": 0.5 for i in range(6)}
    driver.step(job.id, 1, loss=0.7, time=1_700_000_000.0, step_time=0.25, **long_names)
    table = cli("jobs", "metrics", job.id).stdout
    assert "22:13:20" in table and "0.25s" in table and "1.7e+09" not in table
    for name in ["TIME", "STEP_TIME", *(n.upper() for n in long_names)]:
        assert name in table  # whole, not cut
    assert table.count("STEP ") + table.count("STEP\n") >= 2  # split into groups, STEP in each
    assert all(len(line) <= 160 for line in table.splitlines())
