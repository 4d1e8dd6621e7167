"""Activation checkpointing (trainer.modeling.set_activation_checkpointing) changes memory, never
results: log-probs and every trainable gradient equal the run without it, bitwise in fp32 on the
CPU, for full fine-tuning and LoRA; whole runs (the lookahead reference, DDP's and FSDP2's
paths) give the same losses and weights, resume bit for bit and export what plain
transformers loads. Each test also checks the layers really were recomputed in backward, so
the equalities cannot hold because checkpointing silently stayed off.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import moved_policy
from trainer.checkpoint import read_weights
from trainer.logps import token_logps
from trainer.modeling import activation_checkpointing, apply_model_options
from trainer.modeling.layers import decoder_layers
from trainer.tokenize import TokenSeq, collate
from trainer.train import train

LORA = {"kind": "lora", "r": 4, "alpha": 8}


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))  # noqa: E731
    seqs = [TokenSeq(ids(p), ids(c)) for p, c in [(9, 5), (4, 11), (13, 1), (6, 7)]]
    return collate(seqs, 0, share_prompts=False)


def _count_layer_calls(model) -> list[int]:
    """A pre-hook: the recompute stops early once it has what backward needs (torch's
    non-reentrant checkpoint), so a layer's post-forward hook may never run there."""
    calls = [0]
    for layer in decoder_layers(model):
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _logps_and_grads(model, checkpointing: bool):
    """Log-probs and trainable gradients of one forward + backward, and how many decoder-layer
    calls the backward made (the recompute: zero without checkpointing)."""
    apply_model_options(model, checkpointing=checkpointing, compile=False)
    assert activation_checkpointing(model) is checkpointing
    calls = _count_layer_calls(model)
    batch = _batch()
    model.zero_grad(set_to_none=True)
    lp = token_logps(model, batch)
    forward_calls = calls[0]
    # every token weighed differently, so misplaced gradients cannot cancel
    weight = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    (lp * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return lp.detach(), grads, calls[0] - forward_calls


@pytest.mark.parametrize("adapter", [{"kind": "none"}, LORA], ids=["full", "lora"])
def test_checkpointing_gives_bitwise_equal_logps_and_gradients(adapter):
    lp_off, g_off, recomputed_off = _logps_and_grads(moved_policy(**adapter), False)
    model = moved_policy(**adapter)
    lp_on, g_on, recomputed_on = _logps_and_grads(model, True)
    layers = len(decoder_layers(model))
    assert recomputed_off == 0 and recomputed_on == layers  # each layer once more, in backward
    assert torch.equal(lp_on, lp_off)
    assert g_on.keys() == g_off.keys() and len(g_on) > 0
    for name, grad in g_off.items():
        assert grad.abs().sum() > 0, name  # every trainable weight gets a gradient
        assert torch.equal(g_on[name], grad), name


def test_lora_needs_no_grad_on_the_inputs():
    """Non-reentrant checkpointing reaches LoRA's weights without the embedding hook that
    reentrant checkpointing needs; the hook transformers adds is removed (it would only add an
    unused gradient for the embeddings' output) and turning it off undoes everything."""
    model = moved_policy(**LORA)
    apply_model_options(model, checkpointing=True, compile=False)
    base = model.get_base_model()
    assert not getattr(base, "_require_grads_hooks", None)
    out = base.get_input_embeddings()(torch.tensor([[5, 6]]))
    assert not out.requires_grad
    apply_model_options(model, checkpointing=False, compile=False)
    assert not activation_checkpointing(model)
    assert _logps_and_grads(model, False)[2] == 0


def test_no_recompute_without_grad():
    """The reference and the lookahead score under no_grad: nothing is saved, so nothing is
    recomputed, and the values equal the training forward's."""
    model = moved_policy()
    apply_model_options(model, checkpointing=True, compile=False)
    calls = _count_layer_calls(model)
    with torch.no_grad():
        scored = token_logps(model, _batch())
    assert calls[0] == len(decoder_layers(model))
    assert torch.equal(scored, _logps_and_grads(model, True)[0])


# ---- whole runs (trainer.train) ----------------------------------------------------------------


@pytest.fixture
def loader(monkeypatch):
    """trainer.train's load_policy, its decoder layers watched: `state["recomputed"]` counts the
    decoder-layer calls the last run made from inside a backward (the recompute). The trainer
    itself applies the spec's activation_checkpointing (apply_model_options)."""
    import trainer.train as train_mod

    real = train_mod.load_policy
    state = {"recomputed": 0}

    def in_backward(module, args):
        if torch._C._current_graph_task_id() != -1:  # autograd is running a backward
            state["recomputed"] += 1

    def load_policy(spec, model_dir):
        model = real(spec, model_dir)
        state["recomputed"] = 0
        for layer in decoder_layers(model):
            layer.register_forward_pre_hook(in_backward)
        return model

    monkeypatch.setattr(train_mod, "load_policy", load_policy)
    return state


def _metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return read_weights(out / "checkpoints" / f"step-{step}")


def _fsdp(spec):
    return spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"strategy": "fsdp"})}
    )


LR = 3e-3


def _same_run(a: Path, b: Path, step: int) -> None:
    """The same run with and without checkpointing, in one layout (`one_pass_layout`: the
    CPU's shared-prompt layout runs without checkpointing only, and comparing two layouts
    under Adam is what failed on some CPUs, 1.1e-6 > 1e-6).

    LoRA runs are bitwise equal. Full fine-tuning is equal to float rounding only: backward's
    weight-gradient GEMMs read the recomputed activations, and some CPUs' kernels round those
    differently from the saved ones (measured: grad norms 2e-7 apart at step 3, never at
    steps 1-2; single forwards are bitwise, test_checkpointing_gives_bitwise_equal_...). Adam
    divides by the gradient's running RMS, so a rounding difference moves a weight by at most
    a small fraction of lr per step: the bound is 1e-3 · lr · steps (measured 3.0e-7 against
    9e-6), while a wrong or missing gradient moves weights by about lr per step."""
    ma, mb = _metrics(a), _metrics(b)
    assert ma[-1]["loss"] != ma[0]["loss"]  # it trained
    for x, y in zip(ma, mb, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-6)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5)
    wa, wb = _weights(a, step), _weights(b, step)
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-3 * LR * step


@pytest.fixture
def one_pass_layout(monkeypatch):
    """The CPU trainer's layout without the shared-prompt pass (trainer.distributed), the one
    checkpointing forces: turning checkpointing on or off then changes nothing else."""
    from trainer.distributed import Replicated, Sharded

    monkeypatch.setattr(Replicated, "cpu_share_prompts", False)
    monkeypatch.setattr(Sharded, "cpu_share_prompts", False)


CASES = {
    # humanline: the lookahead reference scores under no_grad with the checkpointed policy
    "full-humanline-ddp": ({"variant": "offline+humanline"}, False),
    "lora-ddp": ({"adapter": LORA}, False),
    "full-humanline-fsdp": ({"variant": "offline+humanline"}, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checkpointed_run_equals_the_plain_run(
    tmp_path, make_spec, loader, one_pass_layout, case
):
    kw, sharded = CASES[case]
    spec = make_spec(
        **kw, max_steps=3, grad_accum=1, optim={"lr": LR, "warmup_ratio": 0.0}, quality_sample=0
    )
    spec = _fsdp(spec) if sharded else spec
    train(spec.model_copy(update={"activation_checkpointing": "off"}), tmp_path / "off")
    assert loader["recomputed"] == 0
    train(spec.model_copy(update={"activation_checkpointing": "on"}), tmp_path / "on")
    assert loader["recomputed"] > 0
    _same_run(tmp_path / "off", tmp_path / "on", 3)
    _same_export(tmp_path / "off" / "final", tmp_path / "on" / "final", kw.get("adapter"))


def _same_export(off: Path, on: Path, adapter) -> None:
    """The same files, config and weight names; the checkpointed export loads with plain
    transformers (full) or peft (LoRA) and holds the run's weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.modeling import resolve_model

    assert sorted(p.name for p in off.iterdir()) == sorted(p.name for p in on.iterdir())
    config = "adapter_config.json" if adapter else "config.json"
    assert json.loads((on / config).read_text()) == json.loads((off / config).read_text())
    name = "adapter_model.safetensors" if adapter else "model.safetensors"
    w_off, w_on = load_file(off / name), load_file(on / name)
    assert w_on.keys() == w_off.keys()
    if adapter:
        base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
        model = PeftModel.from_pretrained(base, on)
        loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
        assert len(loaded) == len(w_on)
    else:
        loaded = AutoModelForCausalLM.from_pretrained(on).state_dict()
        for k, v in w_on.items():
            assert torch.equal(loaded[k], v), k


@pytest.mark.parametrize(
    "sharded", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["ddp", "fsdp"]
)
def test_checkpointed_run_resumes_bitwise(tmp_path, make_spec, loader, sharded):
    spec = make_spec(
        variant="offline+humanline",
        activation_checkpointing="on",
        max_steps=4,
        checkpoint_every=2,
        grad_accum=1,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        quality_sample=0,
    )
    spec = _fsdp(spec) if sharded else spec
    train(spec, tmp_path / "whole", progress=False)
    shutil.copytree(
        tmp_path / "whole" / "checkpoints" / "step-2", tmp_path / "part" / "checkpoints" / "step-2"
    )
    train(spec, tmp_path / "part", resume=True, progress=False)
    assert loader["recomputed"] > 0
    whole, resumed = _weights(tmp_path / "whole", 4), _weights(tmp_path / "part", 4)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not all(torch.equal(whole[k], _weights(tmp_path / "whole", 2)[k]) for k in whole)
    scores = lambda out: [(m["loss"], m["grad_norm"]) for m in _metrics(out)[-2:]]  # noqa: E731
    assert scores(tmp_path / "part") == scores(tmp_path / "whole")
