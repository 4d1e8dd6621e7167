"""The paper's defaults and conventions around the maths (issue 12, DESIGN.md §2), each pinned
to the table or the authors' code it comes from. Paper: ../shared/paper/humanline.tex."""

import pytest
from pydantic import ValidationError

from contract.spec import HumanlineParams, JobSpec
from contract.sync import SyncPolicy

BASE = {"base_model": "tiny-llama", "training_file": "x.jsonl"}


def spec(objective="dpo", **kw) -> JobSpec:
    return JobSpec.model_validate({**BASE, "objective": objective, **kw})


# ---- 1. GRPO ε: 0.5 only while the reference never moves ---------------------------------------
@pytest.mark.parametrize(
    "kw, eps",
    [
        ({"variant": "offline"}, 0.5),  # Table tab:obj_if, "Offline GRPO ... 0.50"
        ({"variant": "offline+humanline"}, 0.15),  # "Offline+Humanline GRPO ... 0.15"
        ({"variant": "offline", "reference_sync": "trust_region"}, 0.15),  # synced: moves
        ({"variant": "offline+humanline", "reference_sync": "none"}, 0.5),  # clipping alone: fixed
        ({"variant": "online", "max_steps": 4}, 0.15),  # "Online GRPO ... 0.15"
        ({"variant": "online+humanline", "max_steps": 4}, 0.15),
        ({"variant": "offline+humanline", "objective": {"name": "grpo", "epsilon": 0.3}}, 0.3),
    ],
)
def test_grpo_epsilon_follows_whether_the_reference_moves(kw, eps):
    """Table tab:obj_if's caption: ε must be "much larger when the reference model is fixed"."""
    s = spec(**{"objective": "grpo", **kw})
    assert s.grpo_epsilon == eps
    assert s.resolved().objective.epsilon == eps


def test_sync_policy_is_the_one_decision():
    hl, tr, none = SyncPolicy("humanline", 3), SyncPolicy("trust_region", 3), SyncPolicy("none")
    assert [s for s in range(1, 8) if hl.before_update(s)] == [3, 6]
    assert not any(hl.after_update(s) for s in range(1, 8))
    assert [s for s in range(1, 8) if tr.after_update(s)] == [3, 6]
    assert (hl.reach(3, 100), hl.reach(4, 5), none.reach(0, 40)) == (6, 5, 40)
    assert (hl.moves, tr.moves, none.moves, SyncPolicy("none", online=True).moves) == (
        True,
        True,
        False,
        True,
    )
    assert spec(
        variant="offline+humanline", humanline_params={"sync_every": 4}
    ).sync_policy == SyncPolicy("humanline", 4)


# ---- 2. batch units: DPO pairs, KTO examples, GRPO sequences -----------------------------------
def test_batch_units_give_every_objective_the_same_steps_on_the_same_file():
    """Table tab:hyperparams: batch 32 (DPO) / 64 (KTO, GRPO); "the data volume for KTO/GRPO is
    twice that of DPO because the latter operates on paired preferences containing two sequences
    each", and §C: KTO uses "twice the batch size so that the same number of steps are taken"."""
    dpo, kto, grpo = spec(), spec("kto"), spec("grpo")
    assert [s.batch_unit for s in (dpo, kto, grpo)] == ["pairs", "examples", "sequences"]
    assert [s.global_batch_size for s in (dpo, kto, grpo)] == [32, 64, 64]
    assert [s.examples_per_batch for s in (dpo, kto, grpo)] == [32, 64, 32]  # GRPO: 32 groups of 2
    records = 10_000  # the paper's 10K offline pairs
    steps = [s.total_steps(s.examples_in("preference", records)) for s in (dpo, kto, grpo)]
    assert steps == [312, 312, 312]


def test_online_grpo_batch_counts_every_sequence_of_a_group():
    """Table tab:hyperparams_math: "Batch Size (incl. duplicate prompts due to groups) 256", G 8."""
    s = spec("grpo", variant="online", max_steps=4, preset="math")
    assert (s.global_batch_size, s.group_size, s.examples_per_batch) == (256, 8, 32)
    extremes = spec("grpo", variant="online", max_steps=4, online={"grpo_keep": "extremes"})
    assert (extremes.group_size, extremes.examples_per_batch) == (2, 32)


@pytest.mark.parametrize(
    "kw",
    [
        {"variant": "online", "max_steps": 4, "batch_size": 100},  # groups of 8
        {"batch_size": 63},  # offline pairs: groups of 2
        {"batch_size": 64, "grad_accum": 3},  # 32 groups do not split into 3 micro-batches
    ],
)
def test_a_batch_that_does_not_split_into_groups_names_batch_size(kw):
    with pytest.raises(ValidationError) as err:
        spec("grpo", **kw)
    (e,) = err.value.errors()
    assert e["loc"] == ("batch_size",) and "batch_size" in e["msg"]


# ---- 3. schedule --------------------------------------------------------------------------------
def test_schedule_is_warmup_then_constant_and_the_old_one_stays_selectable():
    """Both of the authors' codebases: open-r1-humanline's ``lr_scheduler_type:
    constant_with_warmup`` with ``warmup_ratio: 0.1``; Table tab:hyperparams "Warmup 10%"."""
    o = spec().optim
    assert (o.schedule, o.warmup_ratio) == ("constant_with_warmup", 0.1)
    assert spec(optim={"schedule": "linear"}).optim.schedule == "linear"


# ---- 4. humanline sampling defaults -------------------------------------------------------------
def test_humanline_sample_defaults_are_the_authors():
    """HALOs (research branch) ``get_humanline_mask``: M = the batch's largest ratio; the Beta
    defaults γ_P 0.5, γ_R 0.01, β_P = β_R = 1. Clip stays the default mode (paper §4)."""
    hp = HumanlineParams()
    assert (hp.mode, hp.M_P, hp.M_R) == ("clip", "batch_max", "batch_max")
    assert (hp.gamma_P, hp.beta_P, hp.gamma_R, hp.beta_R) == (0.5, 1.0, 0.01, 1.0)
    assert HumanlineParams(M_P=2.0).M_P == 2.0
    with pytest.raises(ValidationError):
        HumanlineParams(M_P=0.0)


# ---- 5. presets ---------------------------------------------------------------------------------
def test_math_preset_is_the_papers_math_setup():
    """Table tab:hyperparams_math and the authors' recipe
    config_humanline_64_150_150_12_1e-6.yaml."""
    s = spec("grpo", variant="online+humanline", max_steps=10, preset="math")
    o, on = s.optim, s.online
    assert (s.lr, s.global_batch_size, s.objective.beta_kl, o.eps, o.weight_decay) == (
        1e-6,
        256,
        1e-4,
        1e-8,
        0.0,
    )
    assert 12 <= s.humanline_params.sync_every <= 24
    assert (on.num_samples, on.temperature, on.top_p, on.max_new_tokens) == (8, 0.7, 1.0, 2048)
    assert [(r.name, r.weight) for r in on.rewards] == [
        ("tag_count", 1.0),
        ("format", 1.0),
        ("math_accuracy", 8.0),
    ]
    assert (on.zero_variance_groups, on.divide_logits_by_temperature, s.logps_temperature) == (
        "keep",
        True,
        0.7,
    )
    assert (s.max_prompt_length, s.max_length) == (512, 2560)
    assert (s.grpo_epsilon, o.schedule, o.max_grad_norm) == (0.15, "constant_with_warmup", 1.0)


def test_instruction_preset_is_the_plain_defaults():
    """Table tab:hyperparams / tab:obj_if: the field defaults themselves."""
    for objective in ("dpo", "kto", "grpo"):
        assert spec(objective, preset="instruction") == spec(objective)
    s = spec("grpo", variant="online", max_steps=4)
    assert (s.preset, s.lr, s.optim.eps, s.optim.weight_decay, s.humanline_params.sync_every) == (
        "instruction",
        5e-6,
        1e-5,
        0.01,
        1,
    )
    assert (s.online.top_p, s.online.zero_variance_groups, s.logps_temperature) == (
        0.95,
        "drop",
        1.0,
    )


def test_an_explicit_field_always_wins_over_the_preset():
    s = spec(
        {"name": "grpo", "beta_kl": 0.02},
        variant="online+humanline",
        max_steps=10,
        preset="math",
        optim={"lr": 3e-6},
        batch_size=64,
        humanline_params={"sync_every": 20},
        online={"top_p": 0.9, "zero_variance_groups": "drop", "num_samples": 4},
    )
    assert (s.lr, s.optim.eps, s.global_batch_size, s.objective.beta_kl) == (3e-6, 1e-8, 64, 0.02)
    assert (s.humanline_params.sync_every, s.online.top_p, s.online.zero_variance_groups) == (
        20,
        0.9,
        "drop",
    )
    assert (s.online.num_samples, s.online.temperature) == (4, 0.7)
    nulls = spec(
        "grpo", variant="online", max_steps=4, preset="math", batch_size=None, optim={"lr": None}
    )
    assert (nulls.global_batch_size, nulls.lr) == (256, 1e-6)  # null = "the default": the preset's
    # offline jobs take the preset's optimiser and batch but have no sampling to configure
    off = spec("dpo", preset="math")
    assert (off.online, off.lr, off.global_batch_size) == (None, 1e-6, 256)
    with pytest.raises(ValidationError) as err:
        spec(preset="chemistry")
    assert err.value.errors()[0]["loc"] == ("preset",)


# ---- 8. resolved values -------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("variant", ["offline", "offline+humanline", "online+humanline"])
def test_resolved_spec_has_no_default_left_and_resolves_to_itself(objective, variant):
    s = spec(objective, variant=variant, max_steps=5)
    r = s.resolved()
    dumped = r.model_dump()
    assert None not in (dumped["optim"]["lr"], dumped["batch_size"], dumped["reference_sync"])
    if objective == "grpo":
        assert dumped["objective"]["epsilon"] == s.grpo_epsilon
    assert r.resolved() == r and JobSpec.model_validate(r.model_dump(mode="json")) == r
    assert r.summary(5) == s.summary(5)
    assert {k for k, v in s.summary(5).items() if v is None} <= {"epsilon"}


def test_summary_names_each_resolved_value():
    got = spec("grpo", variant="offline+humanline").summary(312)
    assert got == {
        "preset": "instruction",
        "variant": "offline+humanline",
        "objective": "grpo",
        "lr": 5e-6,
        "batch_size": 64,
        "batch_unit": "sequences",
        "group_size": 2,
        "examples_per_batch": 32,
        "total_steps": 312,
        "epsilon": 0.15,
        "schedule": "constant_with_warmup",
        "warmup_ratio": 0.1,
        "reference_sync": "humanline",
        "sync_every": 1,
    }
