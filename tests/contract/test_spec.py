"""The job spec: paper defaults, shorthands and clear rejections."""

import pytest
from pydantic import ValidationError

from contract.spec import JobSpec, load_spec


def spec(**kw):
    base = {"base_model": "tiny-llama", "training_file": "x.jsonl", "objective": "dpo"}
    return JobSpec.model_validate({**base, **kw})


def test_paper_defaults_per_objective():
    dpo, kto, grpo = spec(), spec(objective="kto"), spec(objective="grpo")
    assert (dpo.lr, dpo.global_batch_size, dpo.objective.beta) == (5e-6, 32, 0.1)
    assert (
        kto.global_batch_size,
        kto.objective.beta,
        kto.objective.lambda_d,
        kto.objective.lambda_u,
    ) == (64, 0.25, 1.1, 1.0)
    assert grpo.grpo_epsilon == 0.5  # offline GRPO uses the larger ε
    assert spec(objective={"name": "grpo", "epsilon": 0.2}).grpo_epsilon == 0.2
    hp = dpo.humanline_params
    assert (hp.log_eps_P, hp.log_eps_R, hp.sync_every, hp.mode) == (-1.5, 1.5, 1, "clip")
    o = dpo.optim
    assert (o.betas, o.eps, o.weight_decay, o.warmup_ratio, o.max_grad_norm) == (
        (0.9, 0.999),
        1e-5,
        0.01,
        0.1,
        1.0,
    )


def test_variant_shorthand_and_sync_default():
    s = spec(variant="offline+humanline")
    assert (s.data_source, s.humanline, s.sync, s.variant) == (
        "offline",
        True,
        "humanline",
        "offline+humanline",
    )
    assert spec().sync == "none"
    assert spec(humanline=True, reference_sync="trust_region").sync == "trust_region"


@pytest.mark.parametrize(
    "kw, where",
    [
        ({"objective": "ppo"}, "objective"),
        ({"humanline_params": {"sync_every": 0}}, "sync_every"),
        ({"humanline_params": {"log_eps_P": 1.0, "log_eps_R": 0.5}}, "log_eps_P"),
        ({"humanline": True, "objective": {"name": "dpo", "reference_free": True}}, "reference"),
        ({"variant": "sideways"}, "variant"),
        ({"batch_size": 10, "grad_accum": 3}, "divisible"),
        ({"max_prompt_length": 1024, "max_length": 512}, "max_prompt_length"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"data_source": "online"}, "max_steps"),
        ({"online": {"tau": 0.5}}, "data_source 'online'"),
    ],
)
def test_invalid_specs_are_rejected_with_the_reason(kw, where):
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    assert where in str(err.value)


def test_load_spec_yaml(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "base_model: tiny-llama\ntraining_file: d.jsonl\nobjective: {name: kto, beta: 0.5}\n"
        "variant: offline+humanline\n"
    )
    s = load_spec(p)
    assert s.objective.name == "kto" and s.objective.beta == 0.5 and s.humanline


@pytest.mark.parametrize(
    "kw, where",
    [
        ({"seed": 2**64}, "seed"),  # orjson (the API's renderer) refuses ints >= 2**64
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"checkpoint_every": 2**64}, "checkpoint_every"),
        ({"checkpoint_every": 2**31}, "checkpoint_every"),  # steps are int4 columns
        ({"log_every": 2**64}, "log_every"),
        ({"log_every": 2**31}, "log_every"),
    ],
)
def test_integers_past_what_is_stored_and_rendered_are_refused(kw, where):
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    assert [e["loc"] for e in err.value.errors()] == [(where,)]


def test_every_signed_64_bit_seed_and_int4_interval_is_accepted():
    assert (spec(seed=2**63 - 1).seed, spec(seed=-(2**63)).seed) == (2**63 - 1, -(2**63))
    assert spec().seed == 0 and spec(seed=-1).seed == -1
    big = spec(checkpoint_every=2**31 - 1, log_every=2**31 - 1)
    assert (big.checkpoint_every, big.log_every) == (2**31 - 1, 2**31 - 1)
