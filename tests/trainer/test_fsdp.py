"""FSDP2 (spec.parallelism.strategy = fsdp) trains like a plain run, resumes bit for bit, and
exports a directory plain transformers/peft load.

One process (a one-rank mesh, in this process) checks every code path cheaply against the
plain run; two CPU processes (gloo, launched with the worker's own argv) check the sharding.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.spec import JobSpec
from trainer.checkpoint import read_weights
from trainer.train import train
from worker.launch import trainer_command
from worker.routing import Placement, trainer_env

REPO = Path(__file__).resolve().parents[2]
LORA = {"kind": "lora", "r": 4, "alpha": 8}
WORLD_CHANGE_ATOL = 1e-6  # a resume at another world size vs the uninterrupted run


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return read_weights(out / "checkpoints" / f"step-{step}")


def metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, worst


def fsdp(spec: JobSpec) -> JobSpec:
    return spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"strategy": "fsdp"})}
    )


def run_two(spec: JobSpec, out: Path, resume: bool = False) -> None:
    """Two CPU ranks, started exactly as the worker starts them (worker.launch)."""
    path = out.parent / f"{out.name}.spec.json"
    path.write_text(spec.model_dump_json())
    place = Placement(2, cpu=True)
    env = {**trainer_env(place), "OMP_NUM_THREADS": "1"}
    argv = trainer_command(sys.executable, path, out, resume=resume, place=place)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    started = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["world_size"] for e in started if e["kind"] == "started"][-1] == 2


CASES = {
    # humanline sync (lookahead reference), 2 micro-steps (no gradient sync on the first)
    "full-humanline-accum": {"variant": "offline+humanline", "grad_accum": 2},
    # sync none, full weights: the frozen reference is a sharded copy
    "full-frozen-reference": {"variant": "offline"},
    # LoRA on unpaired KTO data: rows rarely share a prompt, FSDP still takes the 2-pass layout
    "lora-kto": {"objective": "kto", "adapter": LORA, "variant": "offline+humanline"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_process_fsdp_equals_the_plain_run(tmp_path, make_spec, unpaired_file, case):
    kw = dict(CASES[case], max_steps=3, optim={"lr": 3e-3, "warmup_ratio": 0.0}, quality_sample=4)
    if kw.get("objective") == "kto":
        kw["training_file"] = str(unpaired_file)
    spec = make_spec(**kw)
    train(spec, tmp_path / "plain", progress=False)
    result = train(fsdp(spec), tmp_path / "fsdp", progress=False)
    assert result.status == "succeeded"
    plain, sharded = metrics(tmp_path / "plain"), metrics(tmp_path / "fsdp")
    assert plain[-1]["loss"] != plain[0]["loss"]  # it trained
    for a, b in zip(plain, sharded, strict=True):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
    assert_close(weights(tmp_path / "plain", 3), weights(tmp_path / "fsdp", 3), atol=1e-6)
    state = json.loads((tmp_path / "fsdp" / "checkpoints" / "step-3" / "state.json").read_text())
    assert state["parallelism"] == "fsdp"


@pytest.mark.parametrize("adapter", [{"kind": "none"}, LORA], ids=["full", "lora"])
def test_one_process_fsdp_resumes_bitwise(tmp_path, make_spec, adapter):
    spec = fsdp(
        make_spec(
            variant="offline+humanline",
            adapter=adapter,
            max_steps=4,
            checkpoint_every=2,
            optim={"lr": 3e-3, "warmup_ratio": 0.0},
            quality_sample=0,
        )
    )
    train(spec, tmp_path / "whole", progress=False)
    shutil.copytree(
        tmp_path / "whole" / "checkpoints" / "step-2", tmp_path / "part" / "checkpoints" / "step-2"
    )
    train(spec, tmp_path / "part", resume=True, progress=False)
    whole, resumed = weights(tmp_path / "whole", 4), weights(tmp_path / "part", 4)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not all(torch.equal(whole[k], weights(tmp_path / "whole", 2)[k]) for k in whole)


@pytest.mark.slow
def test_two_processes_match_one_resume_bitwise_and_export_loads(tmp_path, make_spec):
    from transformers import AutoModelForCausalLM

    spec = make_spec(
        variant="offline+humanline",
        batch_size=8,
        grad_accum=2,
        max_steps=4,
        checkpoint_every=2,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        quality_sample=4,
    )
    train(spec, tmp_path / "one", progress=False)
    run_two(fsdp(spec), tmp_path / "two")
    assert_close(weights(tmp_path / "one", 4), weights(tmp_path / "two", 4), atol=2e-5)

    # resume from step 2 as a crashed worker would: steps 3-4 again, bit for bit
    part = tmp_path / "part"
    shutil.copytree(tmp_path / "two", part)
    shutil.rmtree(part / "checkpoints" / "step-4")
    shutil.rmtree(part / "final")
    run_two(fsdp(spec), part, resume=True)
    whole, resumed = weights(tmp_path / "two", 4), weights(part, 4)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    # DCP: each rank wrote its own shard of the model and the AdamW state, no rank the whole
    step4 = part / "checkpoints" / "step-4"
    shards = [(step4 / f"__{rank}_0.distcp").stat().st_size for rank in (0, 1)]
    full = sum(v.numel() * v.element_size() for v in whole.values())
    assert all(full < size < 2.5 * full for size in shards), (shards, full)  # 1/2 x (1 + 2 + 2)

    # another world size (DCP reshards): 2 -> 1 and 1 -> 2 processes from step 2 end within
    # WORLD_CHANGE_ATOL of the uninterrupted run (measured 1.2e-7; 1 vs 2 processes: 8.6e-7)
    shrunk = tmp_path / "shrunk"
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step-2", shrunk / "checkpoints" / "step-2")
    train(fsdp(spec), shrunk, resume=True, progress=False)
    assert_close(weights(tmp_path / "two", 4), weights(shrunk, 4), atol=WORLD_CHANGE_ATOL)
    grown = tmp_path / "grown"
    shutil.copytree(tmp_path / "one" / "checkpoints" / "step-2", grown / "checkpoints" / "step-2")
    run_two(fsdp(spec), grown, resume=True)  # a DDP checkpoint of one process into FSDP on two
    assert_close(weights(tmp_path / "one", 4), weights(grown, 4), atol=WORLD_CHANGE_ATOL)

    # the export is a plain HF directory with the trained weights (tied head included), each
    # rank writing its share (sharded safetensors + index): no rank gathered the model
    final = tmp_path / "two" / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    index = json.loads((final / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    model = AutoModelForCausalLM.from_pretrained(final)
    loaded = model.state_dict()
    for k, v in whole.items():
        assert torch.equal(loaded[k], v), k
    assert torch.equal(loaded["lm_head.weight"], whole["model.embed_tokens.weight"])


@pytest.mark.slow
def test_two_processes_lora_match_one_and_export_loads_with_peft(
    tmp_path, make_spec, unpaired_file
):
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from trainer.modeling import resolve_model

    spec = make_spec(
        objective="kto",
        training_file=str(unpaired_file),
        adapter=LORA,
        variant="offline",
        max_steps=3,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        quality_sample=4,
    )
    train(spec, tmp_path / "one", progress=False)
    run_two(fsdp(spec), tmp_path / "two")
    trained = weights(tmp_path / "two", 3)
    assert_close(weights(tmp_path / "one", 3), trained, atol=2e-5)
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in trained.items())

    final = tmp_path / "two" / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    # the export names its base publicly ("tiny-llama", trainer.modeling.card): load it locally
    assert adapter["base_model_name_or_path"] == "tiny-llama"
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    model = PeftModel.from_pretrained(base, final)
    exported = get_peft_model_state_dict(model)
    assert exported.keys() == trained.keys()
    for k, v in trained.items():
        assert torch.equal(exported[k], v), k


@pytest.mark.parametrize("adapter", [{"kind": "none"}, LORA], ids=["full", "lora"])
def test_one_process_bf16_fsdp_casts_once_per_gather_and_matches_ddp(
    tmp_path, make_spec, monkeypatch, adapter
):
    """bf16 jobs shard with FSDP2's MixedPrecisionPolicy (bf16 all-gather, fp32 reduction):
    the layers see bf16 weights (under autocast alone they would be fp32), master weights stay
    fp32, and the run matches the bf16 DDP run to bf16 rounding. LoRA (a bf16 base, fp32
    adapters: its base weights are bf16 either way) checks the policy composes with peft."""
    import trainer.distributed as distributed

    seen: list[torch.dtype] = []
    real_shard = distributed.shard

    def shard(model, *args):
        real_shard(model, *args)
        if not seen:  # the policy, not the frozen copy
            layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
            layer.register_forward_pre_hook(
                lambda m, _: seen.append(m.self_attn.q_proj.base_layer.weight.dtype
                                         if hasattr(m.self_attn.q_proj, "base_layer")
                                         else m.self_attn.q_proj.weight.dtype)
            )  # fmt: skip

    monkeypatch.setattr(distributed, "shard", shard)
    spec = make_spec(
        variant="offline+humanline",
        adapter=adapter,
        precision="bf16",
        max_steps=3,
        grad_accum=1,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        quality_sample=0,
    )
    train(spec, tmp_path / "plain", progress=False)
    result = train(fsdp(spec), tmp_path / "fsdp", progress=False)
    assert result.status == "succeeded"
    assert seen and set(seen) == {torch.bfloat16}
    plain, sharded = metrics(tmp_path / "plain"), metrics(tmp_path / "fsdp")
    assert plain[-1]["loss"] != plain[0]["loss"]  # it trained
    for a, b in zip(plain, sharded, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-2, abs=1e-2)
    final = weights(tmp_path / "fsdp", 3)
    assert {v.dtype for k, v in final.items() if adapter["kind"] == "none" or "lora" in k} == {
        torch.float32
    }  # fp32 master weights
    assert_close(weights(tmp_path / "plain", 3), final, atol=2e-2)
