"""The examples/ journeys, run as scripts against a real server: submit-only (--no-wait),
to completion with jobs driven through the state machine (fast), and journey (a) with the
real embedded worker training tiny-llama (marked slow: ~15 s)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from humanline_client import Client

from .conftest import MODEL_FILES, ROOT, serve

EXAMPLES = ROOT / "examples"


def run_example(
    server, key: str, name: str, *args: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "HUMANLINE_BASE_URL": server.url,
        "HUMANLINE_API_KEY": key,
        "PYTHONPATH": str(ROOT / "client"),  # the SDK only: examples never import the service
        **env,
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_examples_submit_only(server, team):
    out = run_example(server, team[1], "dpo_offline_humanline.py", "--model", "tiny-llama",
                      HUMANLINE_NO_WAIT="1").stdout  # fmt: skip
    assert "48 preference records" in out and "not waiting" in out
    out = run_example(server, team[1], "compare_variants.py", "--no-wait", "--tag", "t1",
                      "--model", "tiny-llama").stdout  # fmt: skip
    assert "comparison=t1" in out
    with Client(base_url=server.url, api_key=team[1]) as client:
        jobs = list(client.jobs.list())
        assert sorted(j.variant for j in jobs) == [
            "offline",
            "offline+humanline",
            "offline+humanline",
        ]
        compared = list(client.jobs.list(metadata={"comparison": "t1"}))
        assert {j.variant for j in compared} == {"offline", "offline+humanline"}
        assert len({j.spec["seed"] for j in compared}) == 1
        single = client.jobs.list(metadata={"example": "dpo_offline_humanline"}).to_list()
        assert single[0].spec["humanline_params"]["sync_every"] == 1
        assert single[0].spec["objective"]["name"] == "dpo"


def test_examples_to_completion(server, team, auto_worker, tmp_path):
    out = run_example(server, team[1], "dpo_offline_humanline.py", "--model", "tiny-llama",
                      "--download", str(tmp_path / "ckpt")).stdout  # fmt: skip
    assert "succeeded" in out and "step 4: clip_fraction=0.1, loss=0.175" in out
    for name, data in MODEL_FILES.items():  # the exported model, not a checkpoint
        assert (tmp_path / "ckpt" / name).read_bytes() == data
    out = run_example(server, team[1], "compare_variants.py", "--model", "tiny-llama").stdout
    table = out[out.index("metric") :].splitlines()
    assert table[0].split() == ["metric", "offline", "offline+humanline"]
    assert table[1].split() == ["status", "succeeded", "succeeded"]
    assert table[-1].split() == ["loss", "0.175", "0.175"]


@pytest.fixture(scope="module")
def real_worker_server(tmp_path_factory):
    """A second server whose jobs run in the real embedded worker (worker/embedded.py)."""
    from worker import embedded
    from worker.config import WorkerSettings

    root = tmp_path_factory.mktemp("embedded")
    with serve(root, WorkerSettings, WORKER_DIR=str(root / "work"), MAX_JOBS_PER_TEAM=10) as srv:
        embedded.stop(timeout=30)  # one embedded worker per process: not one left by others
        embedded.start(srv.settings)
        srv.queue.handler = embedded.enqueue
        try:
            yield srv
        finally:
            embedded.stop(timeout=30)


@pytest.mark.slow
def test_examples_with_the_embedded_worker(real_worker_server, tmp_path):
    srv = real_worker_server
    _, key = srv.new_team()
    out = run_example(srv, key, "dpo_offline_humanline.py", "--model", "tiny-llama",
                      "--steps", "2", "--download", str(tmp_path / "ckpt")).stdout  # fmt: skip
    assert "succeeded" in out and "loss=" in out and "clamp_frac=" in out
    assert (tmp_path / "ckpt" / "adapter_config.json").stat().st_size > 0
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").stat().st_size > 0
    # (compare_variants.py trains two such jobs one after the other in the embedded worker,
    # ~30 s more; its fast run above covers the script, this one the real training path.)


def test_online_grpo_example_submits_an_online_job_with_an_evaluation(server, team):
    out = run_example(server, team[1], "online_grpo_math.py", "--model", "tiny-llama",
                      HUMANLINE_NO_WAIT="1").stdout  # fmt: skip
    assert "256 prompt prompts" in out and "not waiting" in out
    with Client(base_url=server.url, api_key=team[1]) as client:
        (job,) = client.jobs.list(metadata={"example": "online_grpo_math"}).to_list()
        assert job.variant == "online+humanline" and job.spec["online"]["sample_every"] == 8
        assert [r["name"] for r in job.spec["online"]["rewards"]] == [
            "tag_count",
            "format",
            "math_accuracy",
        ]
        assert job.spec["evaluations"][0]["kind"] == "math"


@pytest.mark.slow
def test_online_grpo_example_with_the_embedded_worker(real_worker_server):
    _, key = real_worker_server.new_team()
    out = run_example(real_worker_server, key, "online_grpo_math.py", "--model", "tiny-llama",
                      "--steps", "2", "--sample-every", "1", "--max-new-tokens", "8",
                      timeout=600).stdout  # fmt: skip
    assert "status: succeeded" in out
    assert "round at step 1:" in out and "round at step 2:" in out and "math_accuracy" in out


@pytest.mark.slow
def test_async_online_grpo_through_the_embedded_service(real_worker_server):
    """online.mode async through the service: the job object shows the resolved mode and lag,
    every round reports the version that sampled it, and the job report draws the
    utilisation panels."""
    _, key = real_worker_server.new_team()
    out = run_example(real_worker_server, key, "online_grpo_math.py", "--model", "tiny-llama",
                      "--steps", "3", "--sample-every", "1", "--max-new-tokens", "8",
                      "--lag", "1", timeout=600).stdout  # fmt: skip
    assert "status: succeeded" in out
    assert "sampled by version 1 (lag 0)" in out  # step 1: max(1, 1 - 1)
    assert "sampled by version 1 (lag 1)" in out and "sampled by version 2 (lag 1)" in out
    with Client(base_url=real_worker_server.url, api_key=key) as client:
        (job,) = client.jobs.list(metadata={"example": "online_grpo_math"}).to_list()
        assert job.spec["online"]["mode"] == "async" and job.spec["online"]["lag"] == 1
        started = [e for e in client.jobs.events(job.id) if e.kind == "started"][-1]
        assert started.data["online_mode"] == "async" and started.data["online_lag"] == 1
        html = client.jobs.report(job.id, format="html")
    assert "Async utilisation: shares of the step" in html and "Sample lag" in html
