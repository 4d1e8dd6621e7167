"""Regional torch.compile (trainer.modeling.compile_layers): each decoder layer compiled in place
computes what the eager layer does, composes with activation checkpointing and FSDP2, keeps the
parameter names, and a compile failure (forced here with a backend that raises) falls back to
eager with a warning, in the same forward, never failing the job.

The graph-level checks use torch's "aot_eager" backend (dynamo and AOTAutograd, no code
generation: seconds on a CPU); one case builds real inductor kernels.
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.conftest import moved_policy
from trainer.logps import token_logps
from trainer.modeling import apply_model_options, compile_layers, set_activation_checkpointing
from trainer.modeling.layers import compiled, decoder_layers
from trainer.tokenize import TokenSeq, collate

LORA = {"kind": "lora", "r": 4, "alpha": 8}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))  # noqa: E731
    seqs = [TokenSeq(ids(p), ids(c)) for p, c in [(9, 5), (4, 11), (13, 1), (6, 7)]]
    return collate(seqs, 0, share_prompts=False)


def _step(model):
    """Log-probs and trainable gradients of one forward + backward."""
    model.zero_grad(set_to_none=True)
    lp = token_logps(model, _batch())
    weight = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    (lp * weight).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _assert_same(a, b, atol: float) -> None:
    (lp_a, g_a), (lp_b, g_b) = a, b
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=atol)
    assert g_a.keys() == g_b.keys()
    for name in g_a:
        torch.testing.assert_close(g_a[name], g_b[name], rtol=1e-4, atol=atol, msg=name)


def _counting_backend(counter: list[int]):
    """aot_eager, counting the graphs it is handed (so a test knows compile really ran)."""
    from torch._dynamo.backends.debugging import aot_eager

    def backend(gm, example_inputs):
        counter[0] += 1
        return aot_eager(gm, example_inputs)

    return backend


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("adapter", [{"kind": "none"}, LORA], ids=["full", "lora"])
def test_compiled_layers_compute_what_eager_does(adapter, checkpointing):
    eager = moved_policy(**adapter)
    set_activation_checkpointing(eager, checkpointing)
    model = moved_policy(**adapter)
    names = [n for n, _ in model.named_parameters()]
    graphs = [0]
    set_activation_checkpointing(model, checkpointing)
    assert compile_layers(model, True, backend=_counting_backend(graphs)) is None
    assert [n for n, _ in model.named_parameters()] == names  # no `_orig_mod.` prefix
    _assert_same(_step(model), _step(eager), atol=1e-6)
    assert graphs[0] > 0 and compiled(model)
    compile_layers(model, False)
    assert not compiled(model)


def test_a_compile_failure_in_the_first_forward_falls_back_to_eager():
    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    eager = moved_policy()
    model = moved_policy()
    warnings: list[str] = []
    set_activation_checkpointing(model, True)
    assert compile_layers(model, True, warn=warnings.append, backend=broken) is None
    assert compiled(model)  # lazily: nothing has compiled yet
    _assert_same(_step(model), _step(eager), atol=0)  # the same forward reran eagerly
    assert len(warnings) == 1 and "no compiler here" in warnings[0], warnings
    assert "training eagerly" in warnings[0]
    assert not compiled(model)  # every layer, not just the one that failed
    _step(model)
    assert len(warnings) == 1


def test_a_compile_failure_at_setup_is_a_warning(monkeypatch):
    model = moved_policy()

    def refuse(self, *args, **kwargs):
        raise RuntimeError("dynamo is not supported here")

    monkeypatch.setattr(torch.nn.Module, "compile", refuse)
    warnings = apply_model_options(model, checkpointing=False, compile=True)
    assert len(warnings) == 1 and "dynamo is not supported here" in warnings[0]
    assert not compiled(model)
    _step(model)


def test_errors_that_are_not_compile_failures_propagate():
    model = moved_policy()
    compile_layers(model, True, backend="aot_eager")
    layer = decoder_layers(model)[0]
    with pytest.raises(RuntimeError):  # a wrong-width input fails eagerly too
        layer(torch.zeros(1, 3, 7), position_embeddings=None, attention_mask=None)


@pytest.mark.slow  # 130 s on the shared 2-core dev machine, most of it building C++
def test_inductor_compiles_a_layer_on_this_machine():
    """One real build (C++ kernels on the CPU); skipped, with the reason, where inductor cannot
    build here (the job would train eagerly with that warning)."""
    eager = moved_policy()
    model = moved_policy()
    warnings: list[str] = []
    set_activation_checkpointing(model, True)
    assert compile_layers(model, True, warn=warnings.append) is None
    result = _step(model)
    if warnings:
        pytest.skip(f"inductor cannot build on this machine: {warnings[0]}")
    assert compiled(model)
    _assert_same(result, _step(eager), atol=2e-5)
