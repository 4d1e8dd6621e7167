"""What a practitioner reads: per-objective panels, no empty charts, labelled axes, the code
version on every page, the online rounds section and its warnings, and a comparison that tells
the story (quality ± CI, cost, quality vs cost, curves, spec differences; a fallback to training
metrics). Every page is rendered by headless Chromium and its DOM checked plot by plot."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from matplotlib.figure import Figure

from reports import (
    build_comparison,
    build_job_report,
    plots,
    render_comparison_html,
    render_evaluation_html,
    render_job_html,
)
from tests.reports.pagecheck import dump_dom, plot_count, plot_problems
from tests.reports.test_report import T0, _evaluation, _instruction_doc, _job_report, _math_doc

GRPO_ONLY = ("PPO clip fraction", "Group advantage", "Policy / old-policy ratio")


def _union_metrics(n: int = 12, zero: bool = False) -> list[dict]:
    """Every metric any objective logs: the panels must be chosen by objective, not by data."""
    z = 0.0 if zero else 1.0
    return [
        {
            "step": s,
            "loss": z * 0.7 * math.exp(-s / 10),
            "rewards/chosen": 0.01 * s,
            "rewards/rejected": -0.01 * s,
            "rewards/margins": z * 0.02 * s,
            "rewards/accuracies": min(1.0, s / 10),
            "logratio/mean": 0.01 * s,
            "kl": 0.001 * s,
            "clamp_frac": 0.05,
            "clip_frac": 0.1,
            "ratio/mean": 1.0,
            "advantages/mean": 0.0,
            "count/desirable": 4.0,
            "count/undesirable": 4.0,
            "grad_norm": z * (1.0 + 0.1 * math.sin(s)),
            "lr": 1e-6,
            "tokens_per_s": 1000.0,
            "step_time": 0.5,
        }
        for s in range(1, n + 1)
    ]


def _rounds(rewards: list[float], prompts: float = 10, kept: float = 4) -> list[dict]:
    return [
        {
            "kind": "round",
            "message": f"round {i}",
            "time": T0 + timedelta(seconds=10 + 4 * i),
            "data": {
                "step": 1 + 4 * i,
                "round/index": float(i),
                "round/prompts": prompts,
                "round/examples": kept,
                "round/sample_time": 2.0,
                "round/score_time": 0.1,
                "reward/mean": r,
                "reward/math_verify": r,
            },
        }
        for i, r in enumerate(rewards)
    ]


def _report(objective: str, variant: str, *, humanline: bool, events=(), zero=False) -> dict:
    return build_job_report(
        job={
            "id": f"job-{objective}",
            "status": "succeeded",
            "objective": objective,
            "variant": variant,
            "result": {"code_version": "git:feed42"},
        },
        spec={"objective": {"name": objective}, "humanline": humanline, "seed": 1},
        metrics=_union_metrics(zero=zero),
        events=list(events),
    )


def test_panels_follow_the_objective():
    dpo = render_job_html(_report("dpo", "offline", humanline=False))
    kto = render_job_html(_report("kto", "offline", humanline=False))
    grpo = render_job_html(_report("grpo", "online", humanline=False))
    for html in (dpo, kto):
        for title in GRPO_ONLY:
            assert title not in html, title
    assert "Reward margin and pair accuracy" in dpo and "Reward margin" not in kto
    assert "Desirable / undesirable per batch" in kto and "Desirable" not in dpo
    assert all(t in grpo for t in GRPO_ONLY) and "Implicit rewards" not in grpo
    # the clamp fraction only with humanline on (without it it is 0 by construction)
    assert "Humanline clamp fraction" not in dpo
    assert "Humanline clamp fraction" in render_job_html(_report("dpo", "offline", humanline=True))


def test_no_panel_for_a_metric_without_finite_values():
    assert plots.line_panel("t", {"a": ([1, 2], [None, float("nan")])}, ylabel="y") == ""
    assert plots.bars(["a"], [float("nan")], title="t", ylabel="y") == ""
    assert plots.histogram([0, 0], [0.0, 1.0, 2.0], title="t", xlabel="x") == ""
    metrics = [{"step": s, "loss": 0.5, "kl": float("nan")} for s in range(1, 4)]
    report = build_job_report(job={"objective": "grpo"}, spec={}, metrics=metrics, events=[])
    html = render_job_html(report)
    assert "KL to reference" not in html and "Loss" in html


def test_online_rounds_section_hand_computed():
    report = _report("grpo", "online", humanline=False, events=_rounds([0.25, 0.5, 0.75]))
    rows = report["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert rows[1]["reward"] == 0.5 and rows[1]["rewards"] == {"math_verify": 0.5}
    assert rows[0]["filtered_share"] == pytest.approx(0.6)  # 1 − 4 kept groups / 10 prompts
    kto = _report("kto", "online", humanline=False, events=_rounds([0.5, 0.6], kept=8))
    assert kto["rounds"][0]["filtered_share"] == pytest.approx(0.6)  # 8 examples = 4 pairs
    html = render_job_html(report)
    assert "Online rounds" in html and "kept groups" in html and "60%" in html
    assert "Reward of sampled completions" in html and "not logged" in html
    assert not any("Flat at zero" in w for w in report["warnings"])
    offline = render_job_html(_report("dpo", "offline", humanline=False))
    assert "Online rounds" not in offline


def test_flat_at_zero_warnings():
    flat = _report("grpo", "online", humanline=False, events=_rounds([0.0, 0.0, 0.0]), zero=True)
    text = " ".join(flat["warnings"])
    assert "mean reward of the sampled completions is 0 in every round" in text
    assert "gradient norm is 0 at every logged step" in text and "loss is 0" in text
    assert "Flat at zero" in render_job_html(flat)
    filtered = _report("grpo", "online", humanline=False, events=_rounds([0.1, 0.2], kept=1))
    assert any("filtered at least 90%" in w for w in filtered["warnings"])


def _entry(jid, variant, *evals, started=None, spec_extra=None, rounds=3):
    metrics = _union_metrics(10)
    for i in range(rounds):
        metrics[4 * i].update(
            {"round/index": float(i), "round/prompts": 10.0, "round/examples": 4.0}
        )
    return {
        "job": {
            "id": jid,
            "objective": "grpo",
            "variant": variant,
            "status": "succeeded",
            "started_at": T0.isoformat(),
            "finished_at": (T0 + timedelta(seconds=100)).isoformat(),
            "result": {"code_version": "git:feed42"},
        },
        "evaluations": list(evals),
        "spec": {
            "objective": {"name": "grpo"},
            "online": {"num_samples": 4, "sample_every": 1},
            "log_every": 1,
            "training_file": jid,
            **(spec_extra or {}),
        },
        "metrics": metrics,
        "started": started or {},
    }


def _story_entries() -> list[dict]:
    return [
        _entry("j-on", "online", _evaluation("e1", "math", 0.40, 0.05)),
        _entry(
            "j-stale",
            "offline",
            _evaluation("e2", "math", 0.30, 0.05),
            spec_extra={"online": {"num_samples": 4, "sample_every": 8}},
            rounds=1,
            started={"device": "cuda", "world_size": 2},
        ),
    ]


def test_comparison_cost_ci_and_spec_differences():
    doc = build_comparison(_story_entries(), metric="pass_at_1")
    rows = {r["job_id"]: r for r in doc["rows"]}
    assert rows["j-on"]["ci95"] == pytest.approx(1.96 * 0.05)
    on, stale = rows["j-on"]["cost"], rows["j-stale"]["cost"]
    assert on["wall_clock_s"] == 100.0 and on["trained_tokens"] == pytest.approx(10 * 500.0)
    assert on["sampled_completions"] == 3 * 10 * 4 and stale["sampled_completions"] == 40
    assert on["gpu_hours"] is None and stale["gpu_hours"] == pytest.approx(100 * 2 / 3600)
    assert doc["spec_differences"] == [("online.sample_every", [1, 8])]  # training_file ignored
    assert doc["fallback"] is None and set(doc["curves"]) >= {"loss", "grad_norm"}
    html = render_comparison_html(doc)
    assert "against cost (± 95% CI)" in html and "completions sampled" in html
    assert "40.0% ± 9.8" in html and "online.sample_every" in html and "git:feed42" in html
    assert html.count("<svg") >= 2 + len(doc["curves"])


def test_comparison_without_the_metric_falls_back_to_training_metrics():
    doc = build_comparison(_story_entries(), metric="lc_win_rate")
    assert doc["fallback"] and "lc_win_rate" in doc["fallback"]
    html = render_comparison_html(doc)
    assert 'id="fallback"' in html and "showing the jobs&#x27; training metrics instead" in html
    assert "by objective and variant" not in html and "against cost" not in html  # no empty charts
    assert "Training curves" in html and "Last logged training metrics" in html


def test_every_page_records_the_code_version():
    pages = [
        render_job_html(_job_report()),
        render_comparison_html(build_comparison(_story_entries(), metric="pass_at_1")),
        render_evaluation_html({**_math_doc(), "code_version": "git:eval99"}),
        render_evaluation_html(_instruction_doc()),
    ]
    for html in pages:
        assert 'id="code-version"' in html and "report rendered by" in html
    assert "code version git:abc123" in pages[0] and "code version git:eval99" in pages[2]


# --- in headless Chromium: every plot has data and labelled axes ---------------------------------

PAGES = {
    "job-dpo": (lambda: render_job_html(_job_report()), 9),
    "job-kto": (lambda: render_job_html(_report("kto", "offline", humanline=True)), 7),
    "job-grpo-online": (
        lambda: render_job_html(
            _report("grpo", "online", humanline=True, events=_rounds([0.2, 0.4]))
        ),
        12,
    ),
    "job-grpo-flat": (
        lambda: render_job_html(
            _report("grpo", "online", humanline=False, events=_rounds([0.0, 0.0]), zero=True)
        ),
        4,
    ),
    "comparison": (
        lambda: render_comparison_html(build_comparison(_story_entries(), "pass_at_1")),
        6,
    ),
    "comparison-fallback": (
        lambda: render_comparison_html(build_comparison(_story_entries(), "lc_win_rate")),
        4,
    ),
    "instruction": (lambda: render_evaluation_html(_instruction_doc()), 1),
    "math": (lambda: render_evaluation_html(_math_doc()), 1),
}


@pytest.mark.parametrize("name", list(PAGES))
def test_pages_in_chromium_have_no_empty_plots(tmp_path, name):
    render, at_least = PAGES[name]
    path = tmp_path / f"{name}.html"
    path.write_text(render(), encoding="utf-8")
    dom = dump_dom(path)
    assert plot_count(dom) >= at_least
    assert plot_problems(dom) == []
    assert 'id="code-version"' in dom


def test_the_plot_check_catches_an_empty_or_unlabelled_plot(tmp_path):
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_title("empty")
    ax.set_xlabel("x")
    ax.xaxis.label.set_gid("xlabel")
    path = tmp_path / "empty.html"
    path.write_text(f"<!DOCTYPE html><html><body>{plots.to_svg(fig)}</body></html>")
    assert plot_problems(dump_dom(path)) == [
        "plot 0 (empty): no data drawn",
        "plot 0 (empty): no ylabel",
    ]


def test_code_version_is_the_checkouts_git_describe():
    import subprocess
    from pathlib import Path

    from reports.version import code_version

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    described = subprocess.run(
        ["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert code_version.__wrapped__() == f"git:{described}"


def test_code_version_without_a_checkout_is_the_package_version(tmp_path, monkeypatch):
    """An image without .git stamps the installed package's version, never a git call's."""
    from importlib import metadata

    from reports import version

    monkeypatch.setattr(version, "REPO", tmp_path)  # no .git here
    monkeypatch.setattr(version.subprocess, "run", lambda *a, **k: pytest.fail("ran git"))
    try:
        expected = f"humanline {metadata.version('humanline')}"
    except metadata.PackageNotFoundError:
        expected = "unknown"
    assert version.code_version.__wrapped__() == expected
