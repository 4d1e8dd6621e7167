"""The `humanline` CLI (typer's CliRunner) against the real server: every command, as tables
for people and as --json parsed back."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from humanline_client.cli import app

from .conftest import PREFERENCE


@pytest.fixture
def prefs(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(PREFERENCE)
    return path


def test_help_version_and_missing_key(server):
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "humanline-server" in top.output
    assert "jobs" in top.output and "files" in top.output
    assert runner.invoke(app, ["--version"]).output.startswith("humanline 0.")
    no_key = runner.invoke(
        app, ["jobs", "list"], env={"HUMANLINE_BASE_URL": server.url, "HUMANLINE_API_KEY": ""}
    )
    assert no_key.exit_code == 1 and "HUMANLINE_API_KEY" in no_key.stderr
    bad_key = runner.invoke(
        app, ["--base-url", server.url, "--api-key", "hl_wrong", "jobs", "list", "--json"]
    )
    assert bad_key.exit_code == 1
    error = json.loads(bad_key.stderr)["error"]
    assert error["status_code"] == 401 and error["type"] == "AuthenticationError"
    assert error["request_id"]


def test_files_commands(cli, prefs, tmp_path):
    up = cli("files", "upload", str(prefs))
    file_id = up.stdout.split()[0]
    assert file_id.startswith("file-") and "8 preference records" in up.stdout
    up_json = json.loads(cli("files", "upload", str(prefs), "--purpose", "train", "--json").stdout)
    assert up_json["format"] == "preference" and up_json["records"] == 8

    table = cli("files", "list").stdout
    assert file_id in table and up_json["id"] in table and "FILENAME" in table
    listed = json.loads(cli("files", "list", "--json").stdout)
    assert [f["id"] for f in listed] == [up_json["id"], file_id]
    assert len(json.loads(cli("files", "list", "--limit", "1", "--json").stdout)) == 1
    assert json.loads(cli("files", "list", "--purpose", "eval", "--json").stdout) == []

    assert "prefs.jsonl" in cli("files", "show", file_id).stdout
    assert json.loads(cli("files", "show", file_id, "--json").stdout)["id"] == file_id

    assert cli("files", "download", file_id).stdout_bytes == PREFERENCE
    cli("files", "download", file_id, "-o", str(tmp_path / "copy.jsonl"))
    assert (tmp_path / "copy.jsonl").read_bytes() == PREFERENCE

    deleted = json.loads(cli("files", "delete", up_json["id"], "--json").stdout)
    assert deleted == {"id": up_json["id"], "object": "file", "deleted": True}
    assert "deleted" in cli("files", "delete", file_id).stdout
    missing = cli("files", "show", file_id, ok=False)
    assert missing.exit_code == 1 and "404" in missing.stderr and "no file" in missing.stderr


def test_files_upload_lists_bad_lines(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(PREFERENCE + b"not json\n")
    result = cli("files", "upload", str(bad), ok=False)
    assert result.exit_code == 1 and "line 9" in result.stderr
    as_json = cli("files", "upload", str(bad), "--json", ok=False)
    error = json.loads(as_json.stderr)["error"]
    assert error["status_code"] == 422 and error["errors"][0]["line"] == 9


def test_jobs_create_with_sets_metadata_and_spec(cli, prefs, tmp_path):
    file_id = json.loads(cli("files", "upload", str(prefs), "--json").stdout)["id"]
    created = json.loads(
        cli(
            "jobs", "create",
            "--objective", "dpo",
            "--variant", "offline+humanline",
            "--model", "tiny-llama",
            "--file", file_id,
            "--max-steps", "5",
            "--set", "optim.lr=1e-6",
            "--set", "humanline_params.sync_every=3",
            "--set", "objective.beta=0.2",
            "--set", "adapter.kind=lora",
            "--metadata", "exp=cli",
            "--json",
        ).stdout
    )  # fmt: skip
    spec = created["spec"]
    assert created["status"] == "queued" and created["variant"] == "offline+humanline"
    assert spec["optim"]["lr"] == 1e-6 and spec["humanline_params"]["sync_every"] == 3
    assert spec["objective"] == {"name": "dpo", "beta": 0.2, "reference_free": False}
    assert spec["adapter"]["kind"] == "lora" and spec["max_steps"] == 5
    assert created["metadata"] == {"exp": "cli"}

    # a local path is uploaded first; a JSON spec is a starting point
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"base_model": "tiny-llama", "objective": "kto", "seed": 3}))
    human = cli("jobs", "create", "--spec", str(spec_file), "--file", str(prefs))
    assert "uploaded" in human.stderr and "created job-" in human.stdout and "kto" in human.stdout

    missing = cli("jobs", "create", "--objective", "dpo", "--file", file_id, ok=False)
    assert missing.exit_code != 0 and "--model" in missing.output
    invalid = cli(
        "jobs", "create", "--objective", "dpo", "--model", "tiny-llama", "--file", file_id,
        "--set", "batch_size=0", ok=False,
    )  # fmt: skip
    assert invalid.exit_code == 1 and "batch_size" in invalid.stderr


def test_jobs_list_show_cancel(cli, client, train_file):
    a = client.jobs.create(
        base_model="tiny-llama", training_file=train_file, objective="dpo", metadata={"k": "a"}
    )
    b = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="kto")
    table = cli("jobs", "list").stdout
    assert a.id in table and b.id in table and "offline" in table and "STATUS" in table
    assert [j["id"] for j in json.loads(cli("jobs", "list", "--json").stdout)] == [b.id, a.id]
    by_meta = json.loads(cli("jobs", "list", "--metadata", "k=a", "--json").stdout)
    assert [j["id"] for j in by_meta] == [a.id]

    assert b.id in cli("jobs", "show", b.id).stdout
    assert json.loads(cli("jobs", "show", b.id, "--json").stdout)["objective"] == "kto"

    assert json.loads(cli("jobs", "cancel", a.id, "--json").stdout)["status"] == "cancelled"
    assert "cancelled" in cli("jobs", "cancel", b.id).stdout
    assert [
        j["id"] for j in json.loads(cli("jobs", "list", "--status", "cancelled", "--json").stdout)
    ] == [b.id, a.id]
    again = cli("jobs", "cancel", a.id, "--json", ok=False)
    assert again.exit_code == 1 and json.loads(again.stderr)["error"]["status_code"] == 409


def test_jobs_events_metrics_checkpoints_download(cli, client, train_file, driver, tmp_path):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.run(job.id, steps=3)
    lines = cli("jobs", "events", job.id).stdout.splitlines()
    assert lines[0].startswith("[1]") and "created" in lines[0] and "succeeded" in lines[-1]
    parsed = [json.loads(x) for x in cli("jobs", "events", job.id, "--json").stdout.splitlines()]
    assert [e["seq"] for e in parsed] == list(range(1, len(parsed) + 1))
    assert [
        e["seq"]
        for e in map(
            json.loads, cli("jobs", "events", job.id, "--after", "3", "--json").stdout.splitlines()
        )
    ] == [e["seq"] for e in parsed[3:]]

    metrics = cli("jobs", "metrics", job.id).stdout
    assert "LOSS" in metrics and "CLIP_FRACTION" in metrics and "0.2333" in metrics
    as_json = json.loads(cli("jobs", "metrics", job.id, "--last", "1", "--json").stdout)
    assert as_json == [{"step": 3, "values": {"loss": 0.2333, "clip_fraction": 0.1}}]

    assert "adapter_model.safetensors" in cli("jobs", "checkpoints", job.id).stdout
    ckpts = json.loads(cli("jobs", "checkpoints", job.id, "--json").stdout)
    assert [c["step"] for c in ckpts] == [3]
    out = tmp_path / "weights.bin"
    cli(
        "jobs",
        "download",
        job.id,
        "--step",
        "3",
        "--file",
        "adapter_model.safetensors",
        "-o",
        str(out),
    )
    assert out.read_bytes() == b"weights" * 10


def test_jobs_events_follow_and_wait(cli, client, train_file, driver):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    worker = driver.in_background(driver.run, job.id, 3, 0.05)
    followed = cli("jobs", "events", job.id, "--follow")
    worker.join()
    assert "running → succeeded" in followed.stdout
    assert followed.stdout.strip().endswith(f"job {job.id} ended: succeeded")
    lines = cli("jobs", "events", job.id, "--follow", "--json").stdout.splitlines()
    assert json.loads(lines[-1])["data"]["to"] == "succeeded"
    waited = json.loads(cli("jobs", "wait", job.id, "--json").stdout)
    assert waited["status"] == "succeeded"

    failing = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(failing.id)
    driver.finish(failing.id, "failed")
    result = cli("jobs", "wait", failing.id, ok=False)
    assert result.exit_code == 1 and f"{failing.id} failed" in result.stdout


def test_jobs_create_wait(cli, auto_worker, train_file):
    result = cli(
        "jobs", "create", "--objective", "dpo", "--variant", "offline+humanline",
        "--model", "tiny-llama", "--file", train_file, "--wait", "--json",
    )  # fmt: skip
    job = json.loads(result.stdout)
    assert job["status"] == "succeeded" and job["current_step"] == 4
    human = cli(
        "jobs", "create", "--objective", "kto", "--model", "tiny-llama", "--file", train_file,
        "--wait",
    )  # fmt: skip
    assert "waiting" in human.stdout and human.stdout.strip().endswith("succeeded")


def test_files_upload_shows_every_error_of_a_line_with_its_field(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "", "chosen": "same", "rejected": "same"}) + "\n")
    result = cli("files", "upload", str(bad), ok=False)
    assert result.exit_code == 1
    assert "line 1: prompt: must not be empty" in result.stderr
    assert "line 1: rejected: is identical to the preferred answer" in result.stderr


def test_the_cli_uses_the_sdks_timeout_unless_given_one():
    """Without --timeout the CLI's client waits as the SDK's does (60 s, 10 s to connect),
    not 60 s for a connection that will never open; --timeout N is N for every phase."""
    import httpx

    from humanline_client._retries import DEFAULT_TIMEOUT
    from humanline_client.cli._app import _Config

    default = _Config("http://127.0.0.1:9", "hl_x", None, 2)
    given = _Config("http://127.0.0.1:9", "hl_x", 5.0, 2)
    try:
        assert default.client().timeout == DEFAULT_TIMEOUT and DEFAULT_TIMEOUT.connect == 10.0
        assert given.client().timeout == httpx.Timeout(5.0)
    finally:
        default.close()
        given.close()


def test_jobs_create_sets_async_online_fields(cli, tmp_path):
    """online.mode / online.lag through --set: the job shows the resolved values."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                               for i in range(4)))  # fmt: skip
    created = json.loads(
        cli(
            "jobs", "create", "--objective", "grpo", "--variant", "online", "--model",
            "tiny-llama", "--file", str(prompts), "--max-steps", "4",
            "--set", "online.mode=async", "--set", "online.lag=2", "--json",
        ).stdout
    )  # fmt: skip
    assert (created["spec"]["online"]["mode"], created["spec"]["online"]["lag"]) == ("async", 2)
