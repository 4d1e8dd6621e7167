# ruff: noqa: F811  (fixtures imported from the modules that define them)
"""Online jobs on FSDP2: each round gathers the sharded policy whole, one tensor at a time,
into every rank's sampler (trainer.sampling.gathered), which then decodes locally.

The contract: an online FSDP job samples exactly what the same job samples without sharding
(same seeds, fp32, the transformers engine), and trains to the same losses within the
tolerance of FSDP itself (its gradients are reduce-scattered, not all-reduced: a different
summation order, ~1e-7 relative per step in fp32). One process checks it in this process;
two CPU processes (gloo, launched with the worker's argv) check the real collectives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import trainer.train as train_mod
from tests.trainer.test_fsdp import LORA, fsdp, metrics
from tests.trainer.test_online import online_spec, prompt_file  # noqa: F401 (a fixture)
from trainer.online import rounds
from worker.launch import trainer_command
from worker.routing import Placement, trainer_env

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = {"full": {"kind": "none"}, "lora": LORA}


def spec_for(prompt_file, reward_model_dir, adapter: str, **kw):
    # 2 rounds of 2 steps: round 2 samples from weights the optimizer moved (a fresh gather)
    return online_spec(
        prompt_file,
        reward_model_dir,
        adapter=ADAPTERS[adapter],
        quality_sample=0,
        grad_accum=1,  # fixed: both runs split their batches alike, whatever the trainer picks
        **kw,
    )


def record_samples(monkeypatch) -> list:
    """Every chunk's sampled token ids, as the round gathered them (all ranks')."""
    seen: list = []
    real = rounds.OnlineData._sample_and_score

    def recording(self, *args):
        groups = real(self, *args)
        seen.append([[list(s.token_ids) for s in g] for g in groups])
        return groups

    monkeypatch.setattr(rounds.OnlineData, "_sample_and_score", recording)
    return seen


def assert_same_losses(a: list[dict], b: list[dict], rel: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert a[-1]["loss"] != a[0]["loss"]  # it trained
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=rel, abs=1e-6), (x["step"], x, y)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_one_process_online_fsdp_samples_and_trains_like_the_plain_run(
    tmp_path, monkeypatch, prompt_file, reward_model_dir, adapter
):
    """The copy's construction (architecture, adapter, tied head, buffers) and the job's
    plumbing. On one rank full_tensor() returns a view of the shard, so the copy follows the
    weights whatever happens: that each round gathers afresh is the two-process test's."""
    spec = spec_for(prompt_file, reward_model_dir, adapter)
    seen = record_samples(monkeypatch)
    train_mod.train(spec, tmp_path / "plain", progress=False)
    plain_samples = seen[:]
    seen.clear()
    result = train_mod.train(fsdp(spec), tmp_path / "fsdp", progress=False)
    assert result.status == "succeeded" and result.step == 4
    assert seen == plain_samples and len(plain_samples) >= 2  # both rounds
    rows = metrics(tmp_path / "fsdp")
    assert [r["step"] for r in rows if "round/index" in r] == [1, 3]
    assert_same_losses(metrics(tmp_path / "plain"), rows, rel=1e-5)


def run_two(spec, out: Path) -> list:
    """Two CPU ranks started as the worker starts them, through the sampling probe; returns
    rank 0's recorded chunks (rank 1's must be the same: every rank builds the same round)."""
    path = out.parent / f"{out.name}.spec.json"
    path.write_text(spec.model_dump_json())
    place = Placement(2, cpu=True)
    argv = trainer_command(sys.executable, path, out, resume=False, place=place)
    module = len(argv) - 1 - argv[::-1].index("-m") + 1  # the trainer's own -m
    argv[module] = "tests.trainer.online_probe"
    env = {**trainer_env(place), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    started = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["world_size"] for e in started if e["kind"] == "started"] == [2]
    chunks = [
        [json.loads(ln) for ln in (out / f"samples-rank-{r}.jsonl").read_text().splitlines()]
        for r in (0, 1)
    ]
    assert chunks[0] == chunks[1]
    return chunks[0]


@pytest.mark.slow
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_two_process_online_fsdp_samples_and_trains_like_ddp(
    tmp_path, prompt_file, reward_model_dir, adapter
):
    """Round 1 samples from the initial weights on both: the very same tokens. Losses agree
    to 1e-4 relative: the DDP and FSDP gradients differ by their reduction order (~1e-7), which
    Adam's normalised steps carry into the weights at ~lr x 1e-4 (test_fsdp bounds the weights
    at 2e-5). Round 2 samples from the trained weights (a stale copy fails step 4's loss:
    0.6722 against 0.6797); its tokens match here too, but one whose two top probabilities
    are within ~1e-6 could flip, so only round 1's tokens are compared."""
    spec = spec_for(prompt_file, reward_model_dir, adapter)
    ddp = run_two(spec, tmp_path / "ddp")
    sharded = run_two(fsdp(spec), tmp_path / "fsdp")
    # round 1's prompts, each a group of completions, in the order the round drew them
    first = int(next(r["round/prompts"] for r in metrics(tmp_path / "ddp") if "round/index" in r))
    want = [g for chunk in ddp for g in chunk][:first]
    assert [g for chunk in sharded for g in chunk][:first] == want and want
    assert_same_losses(metrics(tmp_path / "ddp"), metrics(tmp_path / "fsdp"), rel=1e-4)


# ---- the gather itself (one process, a one-rank mesh in this process) ---------------------------


@pytest.fixture
def sharded_policy(request):
    """tiny-llama's policy (moved off its init) and a sharded twin with the same weights."""
    from accelerate import Accelerator

    from contract.parallel import ParallelConfig
    from tests.trainer.conftest import moved_policy
    from trainer.distributed import Sharded

    adapter = getattr(request, "param", {})
    plain = moved_policy(**adapter)
    twin = moved_policy(**adapter)
    parallel = Sharded(Accelerator(cpu=True), ParallelConfig(strategy="fsdp"))
    parallel.wrap(twin)
    yield plain, twin
    parallel.close()


class GatherCounter:
    """Patches DTensor.full_tensor: how many gathered tensors were alive at once, at most, and
    the largest one gathered (elements)."""

    def __init__(self, monkeypatch):
        from torch.distributed.tensor import DTensor

        self.alive: list[weakref.ref] = []
        self.most_alive = self.largest = self.calls = 0
        real = DTensor.full_tensor

        def full_tensor(t, *a, **kw):
            out = real(t, *a, **kw)
            self.alive = [r for r in self.alive if r() is not None]
            self.alive.append(weakref.ref(out))
            self.most_alive = max(self.most_alive, len(self.alive))
            self.largest = max(self.largest, out.numel())
            self.calls += 1
            return out

        monkeypatch.setattr(DTensor, "full_tensor", full_tensor)


@pytest.mark.parametrize("sharded_policy", [{}, {"kind": "lora", "r": 4}], indirect=True)
def test_the_gathered_copy_is_the_policy_and_is_freed_after_the_round(sharded_policy, monkeypatch):
    from trainer.modeling import load_tokenizer, resolve_model
    from trainer.sampling import SamplingParams
    from trainer.sampling.hf_engine import HFSampler

    plain, sharded = sharded_policy
    tokenizer = load_tokenizer(resolve_model("tiny-llama"))
    counter = GatherCounter(monkeypatch)
    sampler = HFSampler(sharded, tokenizer)
    assert counter.calls == 0  # nothing gathered before the round asks
    sampler.load_weights(sharded)
    copy = sampler.model
    assert copy is not None and copy is not sharded
    # each unique weight gathered once (the tied head with the embedding), none larger than
    # the largest single parameter: one tensor at a time, never a layer stacked or the model
    unique = {id(p): p for p in plain.parameters()}
    assert counter.calls == len(unique)
    assert counter.largest == max(p.numel() for p in unique.values())
    base = copy.get_base_model() if hasattr(copy, "get_base_model") else copy
    assert base.lm_head.weight is base.model.embed_tokens.weight
    want, got = plain.state_dict(), copy.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    params = SamplingParams(n=2, max_new_tokens=8, seed=3)
    prompts = ["What is 2 + 3?", "Name a colour."]
    ours = sampler.generate(prompts, params)
    theirs = HFSampler(plain, tokenizer).generate(prompts, params)
    assert [[c.token_ids for c in g] for g in ours] == [[c.token_ids for c in g] for g in theirs]
    # the round's end drops the copy: nothing else holds it
    ref = weakref.ref(copy)
    del copy, base, got
    sampler.sleep()
    assert ref() is None and sampler.model is None
    with pytest.raises(RuntimeError, match="gathers it first"):
        sampler.generate(prompts, params)


def test_weights_stream_to_the_engine_one_tensor_at_a_time(sharded_policy, monkeypatch):
    """What vLLM's loader receives (hf_weight_items): gathered lazily, so a consumer that
    copies each tensor and drops it never holds two (the old list held the whole model)."""
    from trainer.sampling.vllm_params import hf_weight_items

    plain, sharded = sharded_policy
    counter = GatherCounter(monkeypatch)
    want = plain.state_dict()
    names = []
    for name, tensor in hf_weight_items(sharded):
        assert torch.equal(tensor, want[name]), name
        names.append(name)
        del tensor
    assert counter.most_alive == 1 and counter.calls == len(names)
    assert "lm_head.weight" not in names  # tied: sent once, as the embedding
    assert set(names) | {"lm_head.weight"} == set(want)
