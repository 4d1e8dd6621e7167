"""Supervised fine-tuning: the loss by hand, conversation tokenization, packing equal to the
unpacked loss (values and gradients), and training on tiny-llama (loss falls, resume is exact,
no reference model is ever built)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.spec import JobSpec
from tests.trainer.conftest import moved_policy
from trainer import reference as reference_module
from trainer.checkpoint import read_weights
from trainer.logps import token_logps
from trainer.losses.sft import sft_loss
from trainer.sft_data import as_messages, collate_packed, conversation_seq
from trainer.synthetic import sft_records, write_jsonl
from trainer.tokenize import ChatTokenizer, MaskedSeq, TokenSeq, collate
from trainer.train import train

PAD = 0


# ---- the loss --------------------------------------------------------------------------------
def test_sft_loss_by_hand():
    pol = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -9.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # -7 and -9: a weight-0 turn
    out = sft_loss(pol, mask)
    assert out.loss.item() == pytest.approx((1 + 2 + 0.5) / 3)
    out.loss.backward()
    assert pol.grad is not None
    assert torch.allclose(pol.grad, -mask / 3)  # d/dlp of −Σ lp / N; masked tokens get none
    # the trainer's normalizer: the learned tokens of the whole global batch (here 7)
    assert sft_loss(pol, mask, token_normalizer=7.0).loss.item() == pytest.approx(3.5 / 7)
    assert out.floats()["nll/token"] == pytest.approx(3.5 / 3)


# ---- conversations -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat():
    from trainer.modeling import load_tokenizer, resolve_model

    return ChatTokenizer(load_tokenizer(resolve_model("tiny-llama")), 256, 512)


def test_prompt_completion_tokens_are_the_preference_path(chat):
    seq = conversation_seq(chat, as_messages({"prompt": "What is 2+2?", "completion": "4."}))
    (plain,) = chat.sequences("What is 2+2?", ["4."])
    assert seq is not None and (seq.prompt_ids, seq.completion_ids) == (
        plain.prompt_ids,
        plain.completion_ids,
    )
    assert set(seq.weights) == {1}
    same = conversation_seq(
        chat,
        as_messages(
            {
                "messages": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4."},
                ]
            }
        ),
    )
    assert same == seq


def test_multi_turn_learns_assistant_turns_of_weight_one(chat):
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "ZEROWEIGHT answer.", "weight": 0},
        {"role": "user", "content": "Second question?"},
        {"role": "assistant", "content": "LEARNED two."},
        {"role": "user", "content": "Third question?"},
        {"role": "assistant", "content": "LEARNED three."},
    ]
    seq = conversation_seq(chat, messages)
    assert isinstance(seq, MaskedSeq)
    tok = chat.tok
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    # the row is the whole conversation as the template renders it
    text = tok.decode(seq.prompt_ids + seq.completion_ids)
    assert text == tok.apply_chat_template(plain, tokenize=False)
    # learned: the two later answers' turns (each as the template appends it), nothing else
    learned = [t for t, w in zip(seq.completion_ids, seq.weights, strict=True) if w]
    turns = []
    for i in (4, 6):
        before = tok.apply_chat_template(plain[:i], tokenize=False, add_generation_prompt=True)
        turns.append(tok.apply_chat_template(plain[: i + 1], tokenize=False)[len(before) :])
    assert tok.decode(learned) == "".join(turns)
    assert "ZEROWEIGHT" in tok.decode(seq.prompt_ids)  # context, not learned
    assert "Third question?" in tok.decode(
        [t for t, w in zip(seq.completion_ids, seq.weights, strict=True) if not w]
    )
    # the batch mask is the weights: only learned tokens are scored
    batch = collate([seq], PAD, share_prompts=False)
    assert batch.num_tokens == sum(seq.weights)
    assert batch.labels[batch.mask > 0].tolist() == learned


def test_a_conversation_with_nothing_left_to_learn_is_dropped(chat):
    small = ChatTokenizer(chat.tok, 8, 12)
    messages = [{"role": "user", "content": "word " * 50}, {"role": "assistant", "content": "ok"}]
    seq = small.report.dropped
    assert conversation_seq(small, messages) is not None  # prompt cut from the left
    assert small.report.prompts_truncated == 1 and small.report.dropped == seq


def test_a_template_that_re_renders_history_drops_the_conversation(chat):
    import copy

    tok = copy.deepcopy(chat.tok)
    # earlier assistant turns rendered as "[...]" once a later turn follows (like templates
    # that strip past reasoning): the row would not be what the model sees
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}[...]{% else %}{{ m['content'] }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    lossy = ChatTokenizer(tok, 256, 512)
    two = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    assert conversation_seq(lossy, two) is None
    assert lossy.report.dropped == 1 and "re-renders" in lossy.report.notes[0]
    assert conversation_seq(lossy, two[:2]) is not None  # one turn: nothing re-rendered


def test_the_mask_survives_the_token_store(tmp_path, chat):
    """Examples are stored as token ids plus the learned spans and rebuilt exactly."""
    from trainer.datastore import store_examples
    from trainer.recipes.sft import SFTRecipe

    records = sft_records(12, seed=5)
    recipe = SFTRecipe(_spec(Path("unused.jsonl")))
    built = [conversation_seq(chat, as_messages(r)) for r in records]
    store = store_examples(recipe, "sft", records, chat, tmp_path)
    examples = store.examples()
    assert list(examples) == built
    assert any(0 in e.weights for e in examples)  # the weight-0 turns are there
    store.close()


# ---- packing -----------------------------------------------------------------------------------
def _masked_seqs() -> list[MaskedSeq]:
    gen = torch.Generator().manual_seed(0)

    def ids(n):
        return tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))

    out = []
    for p, c in [(5, 4), (9, 7), (3, 2), (12, 5), (4, 9), (6, 3), (2, 6)]:
        w = tuple(int(x) for x in (torch.rand(c, generator=gen) > 0.3))
        w = w if any(w) else (1,) + w[1:]
        out.append(MaskedSeq(ids(p), ids(c), w))
    return out


def _per_example(lp, batch) -> dict[TokenSeq, torch.Tensor]:
    """Learned-token log-probs of each example, whatever the rows' layout."""
    out = {}
    if batch.position_ids is None:
        for seq, row, m in zip(batch.rows, lp, batch.mask, strict=True):
            out[seq] = row[m > 0]
        return out
    # packed: walk each row's examples in order
    k = 0
    for r in range(lp.shape[0]):
        at = 0
        while k < len(batch.rows) and at + _len(batch.rows[k]) <= int(
            batch.attention_mask[r].sum()
        ):
            seq = batch.rows[k]
            n_p, n = len(seq.prompt_ids), _len(seq)
            sl = slice(at + n_p - 1, at + n - 1)  # the logits predicting its completion
            out[seq] = lp[r, sl][batch.mask[r, sl] > 0]
            at, k = at + n, k + 1
    assert k == len(batch.rows)
    return out


def _len(seq):
    return len(seq.prompt_ids) + len(seq.completion_ids)


def test_packing_equals_the_unpacked_loss_and_gradients():
    torch.manual_seed(0)
    seqs = _masked_seqs()
    model = moved_policy(kind="none").float()
    params = [p for p in model.parameters() if p.requires_grad]

    def run(batch):
        model.zero_grad(set_to_none=True)
        lp = token_logps(model, batch)
        loss = sft_loss(lp, batch.mask).loss
        loss.backward()
        return loss.detach(), _per_example(lp.detach(), batch), [p.grad.clone() for p in params]

    plain = collate(seqs, PAD, share_prompts=False)
    packed = collate_packed(seqs, PAD, max_length=32)
    assert packed.input_ids.shape[0] < len(seqs)  # it really packs
    assert packed.num_tokens == plain.num_tokens
    loss_a, each_a, grads_a = run(plain)
    loss_b, each_b, grads_b = run(packed)
    assert each_a.keys() == each_b.keys()
    for seq in seqs:
        torch.testing.assert_close(each_a[seq], each_b[seq], rtol=0, atol=2e-6)
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=1e-6)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # the control: the same packed rows with attention across examples differ
    packed.position_ids = None
    with torch.no_grad():
        loss_c = sft_loss(token_logps(model, packed), packed.mask).loss
    assert abs(loss_c.item() - loss_a.item()) > 1e-3


# ---- training ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "sft.jsonl", sft_records(64, seed=3))


@pytest.fixture
def no_reference_model(monkeypatch):
    """Fail the test if any reference model is built (a frozen copy, adapter-off, lookahead)."""

    def refuse(*args, **kwargs):
        raise AssertionError("sft built a reference model")

    for name in ("FrozenCopy", "AdapterOff", "Lookahead"):
        monkeypatch.setattr(reference_module, name, refuse)


def _spec(sft_file, **kw) -> JobSpec:
    base = {
        "base_model": "tiny-llama",
        "training_file": str(sft_file),
        "objective": "sft",
        "batch_size": 8,
        "max_steps": 12,
        "max_length": 96,
        "max_prompt_length": 48,
        "optim": {"lr": 3e-3, "warmup_ratio": 0.0},
        "quality_sample": 8,
    }
    return JobSpec.model_validate({**base, **kw})


def _metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_sft_trains_and_packing_changes_nothing(tmp_path, sft_file, no_reference_model):
    result = train(_spec(sft_file), tmp_path / "plain", progress=False)
    assert result.status == "succeeded" and result.step == 12
    losses = [r["loss"] for r in _metrics(tmp_path / "plain")]
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0], losses
    assert (tmp_path / "plain" / "final" / "config.json").is_file()
    packed = _spec(sft_file, objective={"name": "sft", "packing": True})
    train(packed, tmp_path / "packed", progress=False)
    again = [r["loss"] for r in _metrics(tmp_path / "packed")]
    assert again == pytest.approx(losses, rel=1e-4)


@pytest.mark.parametrize("lora", [False, True])
def test_sft_resume_is_bitwise_identical(tmp_path, sft_file, lora, no_reference_model):

    adapter = {"kind": "lora", "r": 4, "alpha": 8} if lora else {"kind": "none"}
    spec = _spec(sft_file, max_steps=5, checkpoint_every=2, adapter=adapter)
    full, part = tmp_path / "full", tmp_path / "part"
    train(spec, full, progress=False)
    part.mkdir()
    (part / "STOP").touch()
    assert train(spec, part, progress=False).status == "stopped"
    (part / "STOP").unlink()
    assert train(spec, part, resume=True, progress=False).step == 5
    a = read_weights(full / "checkpoints" / "step-5")
    b = read_weights(part / "checkpoints" / "step-5")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---- distributed ---------------------------------------------------------------------------------
def _fsdp(spec: JobSpec) -> JobSpec:
    return spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"strategy": "fsdp"})}
    )


def _weights(out: Path, step: int) -> dict[str, torch.Tensor]:

    return read_weights(out / "checkpoints" / f"step-{step}")


def test_one_process_fsdp_equals_the_plain_run(tmp_path, sft_file):
    spec = _spec(sft_file, objective={"name": "sft", "packing": True}, max_steps=3, grad_accum=2)
    train(spec, tmp_path / "plain", progress=False)
    assert train(_fsdp(spec), tmp_path / "fsdp", progress=False).status == "succeeded"
    for a, b in zip(_metrics(tmp_path / "plain"), _metrics(tmp_path / "fsdp"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    one, two = _weights(tmp_path / "plain", 3), _weights(tmp_path / "fsdp", 3)
    assert max((one[k] - two[k]).abs().max().item() for k in one) <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one(tmp_path, sft_file, strategy):
    """Two gloo ranks with packing (their micro-batches pack into different row and token
    counts): the step is still the global batch's token mean, as one process computes it."""
    import subprocess
    import sys

    from worker.launch import trainer_command
    from worker.routing import Placement, trainer_env

    spec = _spec(sft_file, objective={"name": "sft", "packing": True}, max_steps=3, grad_accum=2)
    spec = _fsdp(spec) if strategy == "fsdp" else spec
    train(spec, tmp_path / "one", progress=False)
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    place = Placement(2, cpu=True)
    argv = trainer_command(sys.executable, path, tmp_path / "two", resume=False, place=place)
    env = {**trainer_env(place), "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=repo, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = _weights(tmp_path / "one", 3), _weights(tmp_path / "two", 3)
    assert one.keys() == two.keys()
    assert max((one[k] - two[k]).abs().max().item() for k in one) <= 2e-5
    for a, b in zip(_metrics(tmp_path / "one"), _metrics(tmp_path / "two"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
