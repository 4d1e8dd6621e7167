"""A job report shows the estimate kept at creation beside the actual figures (issue 27 item 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reports import build_job_report, render_job_html

T0 = datetime(2026, 11, 28, 3, 0, tzinfo=UTC)
ESTIMATE = {
    "device": "cpu", "processes": 1, "gpus": 0, "steps": 4, "tokens": 1000,
    "wall_clock_seconds": 30.0, "train_seconds": 20.0, "micro_batch": 2, "grad_accum": 2,
    "memory_gib_per_process": 0.75, "gpu_hours": 0.0,
    "tokens_method": "approximated: 67 tokens per row",
}  # fmt: skip


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _report(created_data: dict) -> dict:
    def status(f, t, s):
        return {"kind": "status", "data": {"from": f, "to": t}, "time": _at(s)}

    events = [
        {"kind": "created", "data": created_data, "time": _at(0)},
        status("validating", "queued", 0),
        status("queued", "running", 5),  # 5 s queued: not part of the prediction
        {"kind": "started", "time": _at(10),  # 5 s setup
         "data": {"micro_batch": 4, "grad_accum": 1, "memory_estimate_gib": 0.8}},
        {"kind": "finished", "data": {}, "time": _at(50)},  # 40 s training
        status("running", "succeeded", 55),  # 5 s finalize
    ]  # fmt: skip
    # 4 steps of 200 tokens each (tokens_per_s × step_time), every step logged
    metrics = [{"step": s, "tokens_per_s": 20.0, "step_time": 10.0} for s in range(1, 5)]
    return build_job_report(
        job={"id": "job-1", "status": "succeeded", "current_step": 4, "created_at": T0,
             "finished_at": _at(55)},
        spec={"base_model": "tiny-llama", "objective": {"name": "dpo"}},
        metrics=metrics,
        events=events,
    )  # fmt: skip


def test_the_report_shows_estimate_and_actual():
    section = _report({"spec": {}, "estimate": ESTIMATE})["estimate"]
    rows = {r["figure"]: r for r in section["rows"]}
    assert (rows["optimizer steps"]["predicted"], rows["optimizer steps"]["actual"]) == (4, 4)
    assert rows["optimizer steps"]["ratio"] == 1.0
    assert rows["training tokens"]["actual"] == 800 and rows["training tokens"]["ratio"] == 1.25
    # setup 5 + training 40 + finalize 5 = 50 s; queueing (5 s) is not predicted
    assert rows["wall-clock (setup to end)"]["actual"] == 50.0
    assert rows["wall-clock (setup to end)"]["ratio"] == 0.6
    assert rows["training phase"]["actual"] == 40.0 and rows["training phase"]["ratio"] == 0.5
    assert rows["micro-batch"]["actual"] == 4 and rows["grad_accum"]["actual"] == 1
    assert rows["peak memory"]["actual"] is None  # not recorded: never invented

    html = render_job_html(_report({"spec": {}, "estimate": ESTIMATE}))
    assert "Estimate vs actual" in html and "not recorded" in html and "0.60" in html


def test_a_job_without_an_estimate_has_no_section():
    report = _report({"spec": {}})
    assert report["estimate"] is None
    assert "Estimate vs actual" not in render_job_html(report)


def test_tokens_scale_when_not_every_step_is_logged():
    from reports.estimate import measured_tokens

    metrics = [{"step": 2, "tokens_per_s": 10.0, "step_time": 3.0}]  # 30 tokens, 1 of 4 steps
    assert measured_tokens(metrics, 4) == 120
    assert measured_tokens([{"step": 1}], 4) is None
