"""benchmarks/testbed.py (issue 28): the task is deterministic and disjoint, the arms differ
only in sampling frequency and humanline, the figures' arithmetic (validity, share closed and
its bootstrap CI) by hand, and `--quick` end to end through the service."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import testbed  # noqa: E402
import testbed_env as tenv  # noqa: E402
import testbed_figures as tf  # noqa: E402

from contract.spec import JobSpec  # noqa: E402


def test_task_is_deterministic_and_held_out_disjoint(tmp_path):
    setup = testbed.Setup(train_size=50, eval_size=20)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pa, pb = testbed.make_task(setup, a), testbed.make_task(setup, b)
    for key in pa:
        assert pa[key].read_text() == pb[key].read_text()
    held = {json.loads(line)["problem"] for line in pa["heldout"].read_text().splitlines()}
    grpo = [json.loads(line) for line in pa["grpo"].read_text().splitlines()]
    sft = [json.loads(line) for line in pa["sft"].read_text().splitlines()]
    assert not held & {r["prompt"][0]["content"] for r in grpo}
    assert not held & {r["prompt"] for r in sft}
    q, ans = grpo[0]["prompt"][0]["content"], grpo[0]["answer"]
    x, y = q.rstrip("=").split("+")
    assert int(x) + int(y) == int(ans)


def test_task_tokenizer_gives_every_digit_its_own_token_and_round_trips():
    """The repo's tiny BPE split numbers into shifting chunks (121 → 12|1) and the base
    plateaued below 2%; the task tokenizer keeps each digit one token, in place."""
    setup = testbed.Setup()
    tok = testbed.task_tokenizer(setup)
    assert tok.get_vocab() == testbed.task_tokenizer(setup).get_vocab()  # deterministic
    text = tok.apply_chat_template(
        [{"role": "user", "content": "907+5="}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text + "912" + tok.eos_token, add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[3:8] == ["9", "0", "7", "+", "5"] and pieces[-4:] == ["9", "1", "2", "<|im_end|>"]
    assert tok.decode(ids[-4:], skip_special_tokens=True) == "912"


def test_arms_differ_only_in_sampling_frequency_and_humanline():
    setup = testbed.Setup(stales=(8, 32), k_sweep=(4, 24))  # studies 1-2's arms
    names = testbed.arms(setup)
    specs = {arm: testbed.grpo_spec(setup, arm, 3, Path("/m"), "file-x") for arm in names}
    for spec in specs.values():
        JobSpec.model_validate(spec)
    assert names["stale-32+humanline"] == (32, testbed.MATH_PRESET_K)
    strip = [
        {**s, "humanline": None, "humanline_params": None, "metadata": None,
         "online": {**s["online"], "sample_every": None}}
        for s in specs.values()
    ]  # fmt: skip
    assert all(s == strip[0] for s in strip)
    assert [s["online"]["sample_every"] for s in specs.values()][:3] == [1, 8, 8]


def _run(acc: float, seed: int = 0) -> dict:
    keys = ("samples_drawn", "rounds", "sampling_s", "training_s", "wall_clock_s",
            "clamp_frac_max", "clamp_frac_mean", "kl_max", "kl_mean")  # fmt: skip
    return {"seed": seed, "accuracy": acc, "curve": {4: acc}, "samples_curve": {4: 8.0},
            **dict.fromkeys(keys, 1.0)}  # fmt: skip


def _arms(on, st, hl, s=8):
    named = (("online", on), (f"stale-{s}", st), (f"stale-{s}+humanline", hl))
    return {name: [_run(v, seed) for seed, v in enumerate(vals)] for name, vals in named}


# Worked by hand (three seeds): C_i = hl − (on + st)/2 = 0.05, 0.07, 0.03: mean 0.05, sd 0.02,
# SE 0.02/√3 = 0.0115470; t(0.975, 2) = 4.302653, half-width 0.0496828 → [0.000317, 0.099683],
# above 0 (barely). hl − st = 0.20, 0.22, 0.18 over a constant gap on − st = 0.30: Fieller
# reduces to (0.20 ± 0.0496828)/0.30 = [0.501058, 0.832276].
ON, ST, HL = [0.50, 0.52, 0.48], [0.20, 0.22, 0.18], [0.40, 0.44, 0.36]


def test_t_quantiles_match_the_tables():
    table = {1: 12.706205, 2: 4.302653, 4: 2.776445, 9: 2.262157, 15: 2.131450, 30: 2.042272}
    for df, q in table.items():
        assert tf.t_quantile(0.975, df) == pytest.approx(q, abs=1e-6)
    assert tf.t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    assert tf.t_quantile(0.95, 15) == pytest.approx(1.753050, abs=1e-6)
    assert tf.t_cdf(0.0, 3) == 0.5


def test_paired_contrast_fieller_and_differences_by_hand():
    out = tf.paired_analysis(_arms(ON, ST, HL), 8)
    c = out["contrast"]
    assert out["n_pairs"] == 3 and c["df"] == 2
    assert c["mean"] == pytest.approx(0.05) and c["se"] == pytest.approx(0.011547, abs=1e-6)
    assert c["ci95"] == pytest.approx((0.000317, 0.099683), abs=1e-6)
    assert c["verdict"] == "closes at least half"
    share = out["share_closed"]
    assert share["method"] == "fieller" and share["value"] == pytest.approx(2 / 3)
    assert share["ci95"] == pytest.approx((0.501058, 0.832276), abs=1e-6)
    assert out["hl_minus_stale"]["ci95"] == pytest.approx((0.150317, 0.249683), abs=1e-6)
    assert out["online_minus_hl"]["mean"] == pytest.approx(0.10)
    assert out["online_minus_hl"]["ci95"] == pytest.approx((0.050317, 0.149683), abs=1e-6)
    # the verdict rule: an interval below 0, and one that straddles it
    assert tf.contrast_verdict((-0.2, -0.01)) == "closes less than half"
    assert tf.contrast_verdict((-0.01, 0.2)) == "inconclusive"


def test_fieller_endpoints_solve_its_equation_and_unbounded_is_none():
    num, den = [0.02, 0.05, 0.01, 0.04, 0.03], [0.07, 0.09, 0.05, 0.08, 0.06]
    lo, hi = tf.fieller(num, den)
    a, b, n = tf.mean(num), tf.mean(den), len(num)
    v11, v22 = tf.statistics.variance(num) / n, tf.statistics.variance(den) / n
    v12 = tf.statistics.covariance(num, den) / n
    t2 = tf.t_quantile(0.975, n - 1) ** 2
    for rho in (lo, hi):  # (ā − ρ b̄)² = t² (v11 − 2ρ v12 + ρ² v22)
        assert (a - rho * b) ** 2 == pytest.approx(t2 * (v11 - 2 * rho * v12 + rho**2 * v22))
    assert lo < a / b < hi
    assert tf.fieller([0.1, 0.2, 0.0], [0.1, -0.1, 0.05]) is None  # gap not ≠ 0: unbounded


def test_pairs_by_seed_not_by_position_and_drops_incomplete_seeds():
    results = _arms(ON, ST, HL)
    results["online"] = results["online"][::-1]  # order differs, seeds pair them
    results["stale-8+humanline"].append(_run(0.9, seed=7))  # no partner in the other arms
    assert tf.paired(results, "online", "stale-8", "stale-8+humanline") == [
        [0.50, 0.20, 0.40], [0.52, 0.22, 0.44], [0.48, 0.18, 0.36]]  # fmt: skip


def test_figures_validity_contrast_and_table_by_hand():
    setup = {"stales": [8]}
    results = _arms(ON, ST, HL)
    summary = tf.figures(setup, results, 0.1, 12)
    out = summary["by_stale"][8]
    assert out["gap_online_minus_stale"]["value"] == pytest.approx(0.30)
    assert out["gap_online_minus_stale"]["met"]  # 0.30 ≫ 3 × √(2) × 0.0115
    assert out["contrast"]["met"] and out["verdict"] == "humanline closes at least half"
    table = tf.markdown(summary)
    assert (
        "| 8 | +30.0 ± 1.6 pts | yes | +5.0 pts [+0.0, +10.0] | 0.67 | [0.50, 0.83] (fieller)"
        in table
    )
    assert "| online | 50.0 ± 1.2% | 50.0 ± 1.2% |" in table
    summary |= {"seeds_left_out": [11], "fingerprint": {
        "base_sha256": "ab12", "base_pinned": True, "torch": "2.x", "cpu_model": "CPU",
        "cpu_isa": "AVX512", "aten_capability": "AVX2", "threads": 1,
        "arm_env": {"OMP_NUM_THREADS": "2"}, "code_version": "git:x"}}  # fmt: skip
    assert "left out at the deadline: [11]. Fingerprint: base sha256 `ab12` (pinned)" in (
        tf.markdown(summary))  # fmt: skip
    results["stale-8"] = [_run(v, i) for i, v in enumerate((0.49, 0.60, 0.30))]  # gap ~0.04
    out = tf.figures(setup, results, 0.1, 12)["by_stale"][8]
    assert not out["gap_online_minus_stale"]["met"] and not out["contrast"]["met"]
    assert out["verdict"].startswith("testbed invalid")


def test_mechanism_metrics_by_hand():
    spec = {"optim": {"max_grad_norm": 1.0}, "objective": {"name": "grpo", "beta_kl": 0.01}}
    metrics = [{"grad_norm": 2.0, "kl": 1.0, "loss": 0.03, "clamp_frac": 0.1},
               {"grad_norm": 0.5, "kl": 0.0, "loss": -0.02, "clamp_frac": 0.0}]  # fmt: skip
    # step 1: |0.01·1| / (0.01 + |0.03 − 0.01|) = 1/3; step 2: 0; clipped 1 of 2 steps
    assert tf.mechanism(metrics, spec) == pytest.approx(
        {"grad_clipped_share": 0.5, "kl_loss_share": 1 / 6, "clamp_frac": 0.05}
    )
    assert tf.mechanism([{"loss": 1.0}], {}) == {
        "grad_clipped_share": None, "kl_loss_share": None, "clamp_frac": None}  # fmt: skip


def test_base_pin_refuses_other_weights_unless_unpinned(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"not the base")
    digest = hashlib.sha256(b"not the base").hexdigest()
    assert tenv.check_base(tmp_path, pinned=digest) == digest
    with pytest.raises(tenv.BaseMismatch, match="--unpinned"):
        tenv.check_base(tmp_path)  # against the pinned BASE_SHA256
    assert tenv.check_base(tmp_path, unpinned=True) == digest
    fp = tenv.fingerprint(tmp_path, unpinned=True)
    assert fp["base_sha256"] == digest and not fp["base_pinned"] and fp["unpinned_allowed"]
    import torch

    assert fp["torch"] == torch.__version__ and fp["threads"] == torch.get_num_threads()
    assert fp["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["cpu_model"] and fp["cpu_isa"] and fp["code_version"]
    assert set(fp["pinned_env"]) == set(tenv.PIN_ENV)
    assert fp["base_build_env"]["OMP_NUM_THREADS"] == "1"  # the base: one thread
    assert fp["arm_env"]["OMP_NUM_THREADS"] == "2"  # the arms: two, the same kernels
    assert fp["arm_env"]["ATEN_CPU_CAPABILITY"] == "avx2"


def test_defaults_are_the_preregistered_confirmatory_study():
    setup = testbed.Setup()
    assert testbed.arms(setup) == {"online": (1, None), "stale-32": (32, None),
                                   "stale-32+humanline": (32, 12)}  # fmt: skip
    assert setup.seeds == list(range(10, 26)) and setup.eval_points == 1
    assert setup.deadline_min == 45.0
    spec = testbed.grpo_spec(setup, "online", 10, Path("/m"), "file-x")
    assert spec["checkpoint_every"] == spec["max_steps"] == 128  # the final checkpoint only


def test_arms_flag_selects_and_rejects_unknown():
    setup = testbed.Setup(arm_names=("online", "stale-32", "stale-32+humanline"), k_sweep=())
    assert testbed.arms(setup) == {"online": (1, None), "stale-32": (32, None),
                                   "stale-32+humanline": (32, 12)}  # fmt: skip
    with pytest.raises(SystemExit, match="stale-7"):
        testbed.arms(testbed.Setup(arm_names=("stale-7",)))


def test_lags_add_async_arms_the_service_admits():
    """`--lags 4`: async-4 (plain) and async-4+humanline (k 12), each a valid async job spec."""
    from contract.spec import JobSpec

    setup = testbed.Setup(lags=(4,))
    names = testbed.arms(setup)
    assert names["async-4"] == (1, None) and names["async-4+humanline"] == (1, 12)
    for arm, humanline in (("async-4", False), ("async-4+humanline", True)):
        spec = JobSpec.model_validate(testbed.grpo_spec(setup, arm, 10, Path("/m"), "f.jsonl"))
        assert spec.online.mode == "async" and spec.online.resolved_lag == 4
        assert spec.online.sample_every == 1 and spec.humanline is humanline
    online = JobSpec.model_validate(testbed.grpo_spec(setup, "online", 10, Path("/m"), "f.jsonl"))
    assert online.online.mode == "sync"


class _Fake:
    """Just enough of the SDK for collect(): one eval file, the study's jobs, a base eval."""

    def __init__(self, seeds, arms):
        ns = type("NS", (), {})
        self.files, self.jobs, self.evaluations, self.reports = ns(), ns(), ns(), ns()
        heldout = type("F", (), {"filename": "addition_heldout.jsonl", "id": "file-h"})
        self.files.list = lambda **_: [heldout]
        self.jobs.list = lambda **_: [
            type("J", (), {"id": f"{a}/{s}", "metadata": {"arm": a}, "spec": {"seed": s}})
            for s in seeds for a in arms
        ]  # fmt: skip
        result = {"metrics": {"pass_at_1": 0.2}}
        base = type("E", (), {"job_id": None, "base_model": "/x/base", "file_id": "file-h",
                              "status": "succeeded", "result": result})  # fmt: skip
        self.evaluations.list = lambda **_: [base]
        self.reports.compare = lambda **kw: self.__dict__.setdefault("compared", kw["jobs"])


def test_deadline_keeps_only_seeds_with_every_arm_complete(tmp_path, monkeypatch):
    setup = testbed.Setup(stales=(32,), k_sweep=(), seeds=[10, 11, 12])
    client = _Fake(setup.seeds, testbed.arms(setup))

    def follow(client, job_id, seed, setup, request, timeout):
        if job_id == "stale-32+humanline/11":  # one arm of seed 11 misses the time box
            raise TimeoutError(job_id)
        return {"seed": seed, "job": job_id, "accuracy": 0.5}

    monkeypatch.setattr(testbed, "follow", follow)
    results, base, dropped = testbed.collect(setup, tmp_path, client, deadline=1e12)
    assert dropped == [11] and base == 0.2
    assert {a: [r["seed"] for r in runs] for a, runs in results.items()} == {
        "online": [10, 12], "stale-32": [10, 12], "stale-32+humanline": [10, 12]}  # fmt: skip
    assert "online/11" not in client.compared  # the report holds complete seeds only


def test_a_study_queues_each_seed_once_the_previous_seeds_jobs_ended(tmp_path, monkeypatch):
    """The embedded worker runs work in order: queued all at once, every evaluation would wait
    behind all 48 jobs. Seed by seed, a seed's evaluations run before the next seed's jobs."""
    setup = testbed.Setup(seeds=[10, 11, 12])
    client = _Fake([], testbed.arms(setup))  # nothing queued before the study starts
    log: list[tuple[str, object]] = []
    client.jobs.wait = lambda job_id, timeout: log.append(("wait", job_id))

    def queue(seed):
        log.append(("queue", seed))
        return {(a, seed): f"{a}/{seed}" for a in testbed.arms(setup)}

    def follow(client, job_id, seed, setup, request, timeout):
        log.append(("follow", job_id))
        return {"seed": seed, "job": job_id, "accuracy": 0.5}

    monkeypatch.setattr(testbed, "follow", follow)
    results, _, dropped = testbed.collect(setup, tmp_path, client, queue=queue)
    assert dropped == [] and [r["seed"] for r in results["online"]] == [10, 11, 12]
    assert log[0] == ("queue", 10) and [e for e in log if e[0] == "queue"][1:] == [
        ("queue", 11), ("queue", 12)]  # fmt: skip
    assert log.index(("queue", 11)) > log.index(("wait", "stale-32+humanline/10"))
    assert log.index(("queue", 11)) < log.index(("follow", "online/10"))
    log.clear()  # past the deadline: no further seed is queued; those seeds are left out
    results, _, dropped = testbed.collect(setup, tmp_path, client, deadline=0.0, queue=queue)
    assert dropped == [11, 12] and [e for e in log if e[0] == "queue"] == [("queue", 10)]


@pytest.mark.slow
def test_pinned_build_reproduces_the_base_hash(tmp_path):
    """The pin: `testbed.py build` (PIN_ENV: AVX2 kernels, one thread) rebuilds the base to
    BASE_SHA256 and refuses nothing; about 2 minutes on 2 cores."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'client'}"}
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/testbed.py"), "build", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["base_sha256"] == tenv.BASE_SHA256
    assert summary["fingerprint"]["aten_capability"] == "AVX2"
    assert summary["fingerprint"]["threads"] == 1


@pytest.mark.slow
def test_quick_runs_the_product_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'client'}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/testbed.py"), "--quick", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "quick" and Path(summary["png"]).stat().st_size > 0
    assert set(summary["arms"]) == {"online", "stale-2", "stale-2+humanline"}
    assert [summary["arms"][a]["rounds"] for a in summary["arms"]] == [2, 1, 1]
    fp = summary["fingerprint"]
    assert fp["unpinned_allowed"] and fp["base_sha256"] and fp["aten_capability"] == "AVX2"
    assert summary["seeds_left_out"] == [] and summary["by_stale"]["2"]["contrast"]["n"] == 1
    for data in summary["arms"].values():  # the mechanism, from the jobs' step metrics
        assert data["grad_clipped_share"] is not None and data["kl_loss_share"] is not None
    page = Path(summary["report"]).read_text()
    assert "Groups by arm" in page  # the service's report draws each arm's curve with bands
    for data in summary["arms"].values():
        assert data["per_seed"][0]["job"] in page
