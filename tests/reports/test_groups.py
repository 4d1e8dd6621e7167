"""reports.groups: jobs grouped by a metadata key, each group's metric per evaluated step as
mean ± SE over its jobs (hand-computed), against steps and against completions sampled."""

from __future__ import annotations

import math

import pytest

from reports import build_comparison, render_comparison_html
from reports.groups import UNSET, build_groups, job_points


def _ev(value, step=None, *, status="succeeded", file_id="f", created="2026-01-01", id_="e"):
    return {"id": id_, "status": status, "file_id": file_id, "step": step,
            "created_at": created, "metrics": {"pass_at_1": {"value": value, "se": 0.03,
                                                             "n": 200}}}  # fmt: skip


def _entry(job, arm, evals, rounds=(), num_samples=2):
    metrics = [{"step": s, "loss": 0.1} for s in range(1, 5)]
    for step, prompts in rounds:
        metrics[step - 1] |= {"round/index": 0.0, "round/prompts": prompts}
    return {"job": {"id": job, "metadata": {"arm": arm} if arm else {}}, "evaluations": evals,
            "spec": {"max_steps": 4, "online": {"num_samples": num_samples}},
            "metrics": metrics}  # fmt: skip


def _entries():
    return [
        _entry("j1", "a", [_ev(0.4, 2), _ev(0.9, 2, status="failed"), _ev(0.6),
                           _ev(0.1, 2, file_id="other")], rounds=[(1, 3), (4, 3)]),
        # an older evaluation of step 2 (0.0) loses to the newer one (0.2)
        _entry("j2", "a", [_ev(0.0, 2, created="2025-12-31", id_="e0"), _ev(0.2, 2), _ev(0.8)],
               rounds=[(1, 5)]),
        _entry("j3", "b", [_ev(0.5)], rounds=[(1, 2)]),
        _entry("j4", None, [_ev(0.3)]),
    ]  # fmt: skip


def test_a_jobs_points_take_the_final_model_at_its_last_step_and_the_newest_evaluation():
    e = _entries()
    assert job_points(e[0], "pass_at_1", "f") == {2: 0.4, 4: 0.6}
    assert job_points(e[0], "pass_at_1", None) in ({2: 0.1, 4: 0.6}, {2: 0.4, 4: 0.6})
    assert job_points(e[1], "pass_at_1", "f") == {2: 0.2, 4: 0.8}


def test_groups_by_hand():
    groups = {g["group"]: g for g in build_groups(_entries(), "arm", "pass_at_1", "f")}
    assert list(groups) == ["a", "b", UNSET]
    a = groups["a"]
    assert a["jobs"] == ["j1", "j2"]
    # step 2: (0.4, 0.2) → 0.3 ± sd 0.1414/√2 = 0.1; step 4: (0.6, 0.8) → 0.7 ± 0.1
    assert [(c["step"], c["n"]) for c in a["curve"]] == [(2, 2), (4, 2)]
    assert [c["mean"] for c in a["curve"]] == pytest.approx([0.3, 0.7])
    assert [c["se"] for c in a["curve"]] == pytest.approx([0.1, 0.1])
    # sampled: j1 3×2 by step 2, 6×2 by step 4 (a round begun at 4 counts); j2 5×2 → 8, 11
    assert [c["sampled"] for c in a["curve"]] == pytest.approx([8.0, 11.0])
    assert a["final"]["mean"] == pytest.approx(0.7) and a["final"]["n"] == 2
    assert a["sampled_completions"] == pytest.approx(11.0)
    assert groups["b"]["final"]["se"] is None and groups["b"]["curve"][0]["step"] == 4
    assert groups[UNSET]["jobs"] == ["j4"] and groups[UNSET]["sampled_completions"] == 0


def test_the_comparison_page_draws_each_group_with_bands_against_steps_and_samples():
    doc = build_comparison(_entries(), metric="pass_at_1", file_id="f", group_by="arm")
    assert doc["groups"]["key"] == "arm" and len(doc["groups"]["groups"]) == 3
    assert math.isclose(doc["groups"]["groups"][0]["final"]["mean"], 0.7)
    html = render_comparison_html(doc)
    section = html[html.index("Groups by arm") :]
    assert section.count("<svg") >= 2 and 'id="' in section
    assert "band-0" in section and "completions sampled" in section
    assert "70.0 ± 10.0" in section  # group a's final, in percent
    assert "Groups by" not in render_comparison_html(build_comparison(_entries(), "pass_at_1"))
