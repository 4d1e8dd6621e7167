"""Reports: the JSON, wall-clock phases, self-contained HTML (no URLs, escaped), and the pages
rendered by headless Chromium: screenshot not blank, no console errors."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reports import (
    build_comparison,
    build_job_report,
    load_run_dir,
    render_comparison_html,
    render_evaluation_html,
    render_job_html,
)
from reports.job import phases
from tests.fixtures.browser import non_blank_fraction, render_in_chromium

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
XSS = "<script>alert('x')</script>"


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _events() -> list[dict]:
    def status(f, t, s):
        return {"kind": "status", "data": {"from": f, "to": t}, "time": _at(s)}

    return [
        {"kind": "created", "data": {}, "time": _at(0)},
        status("validating", "queued", 0),
        status("queued", "running", 10),  # 10 s queued
        {"kind": "data", "message": "32 examples", "data": {}, "time": _at(12)},
        {"kind": "started", "data": {}, "time": _at(15)},  # 5 s setup
        status("running", "queued", 40),  # worker lost after 25 s of training
        status("queued", "running", 50),  # 10 s queued again
        {"kind": "resumed", "data": {}, "time": _at(53)},  # 3 s setup
        {"kind": "warning", "message": f"low data quality {XSS}", "data": {}, "time": _at(54)},
        {"kind": "finished", "data": {}, "time": _at(100)},  # 47 s training
        status("running", "succeeded", 104),  # 4 s finalize
    ]


def _metrics(n: int = 30) -> list[dict]:
    return [
        {
            "step": s,
            "loss": 0.69 * math.exp(-s / 20),
            "rewards/chosen": 0.01 * s,
            "rewards/rejected": -0.01 * s,
            "rewards/margins": 0.02 * s,
            "rewards/accuracies": min(1.0, s / 20),
            "clamp_frac": 0.05,
            "kl": 0.001 * s,
            "grad_norm": 1.0 + 0.1 * math.sin(s),
            "lr": 5e-6 * (1 - s / n),
            "tokens_per_s": 1000.0,
        }
        for s in range(1, n + 1)
    ]


DQ = {
    "n": 64,
    "mean": -0.8,
    "quantiles": {"min": -2.1, "q25": -1.0, "median": -0.8, "q75": -0.5, "max": -0.1},
    "histogram": {
        "counts": [1, 3, 8, 12, 16, 12, 8, 3, 1],
        "edges": [-2.1 + 0.222 * i for i in range(10)],
    },
    "fraction_at_or_below_low_quartile": 0.7,
    "low_quartile_top": -0.36,
    "warning": "70% of sampled completions are in the low quartile",
}


def _evaluation(
    eid: str, kind: str, value: float, se: float, step=None, file_id="file-a", status="succeeded"
):
    metric = {"instruction": "lc_win_rate", "math": "pass_at_1"}[kind]
    metrics = {metric: {"value": value, "se": se, "n": 100}}
    if kind == "instruction":
        metrics["win_rate"] = {"value": value + 0.05, "se": se, "n": 100}
        metrics["avg_length"] = 900.0
    return {
        "id": eid,
        "kind": kind,
        "status": status,
        "step": step,
        "file_id": file_id,
        "job_id": "job-1",
        "metrics": metrics,
        "judge": "openai:gpt-4.1",
        "created_at": f"2026-01-0{1 + len(eid) % 5}T00:00:00",
    }


def _job_report() -> dict:
    return build_job_report(
        job={
            "id": "job-1",
            "status": "succeeded",
            "objective": "dpo",
            "variant": "offline+humanline",
            "base_model": "tiny-llama",
            "created_at": T0,
            "finished_at": _at(104),
            "metadata": {"note": XSS},
            "result": {"code_version": "git:abc123"},
        },
        spec={
            "base_model": "tiny-llama",
            "objective": {"name": "dpo"},
            "seed": 7,
            "training_file": "file-t",
        },
        metrics=_metrics(),
        events=_events(),
        data_quality=DQ,
        evaluations=[
            _evaluation("eval-1", "instruction", 0.42, 0.03, step=10),
            _evaluation("eval-2", "instruction", 0.47, 0.03),
            _evaluation("eval-3", "math", 0.3, 0.05),
        ],
        training_file={
            "id": "file-t",
            "sha256": "ab" * 32,
            "format": "preference",
            "records": 32,
            "bytes": 999,
        },
    )


def test_wall_clock_per_phase_from_events():
    out = phases(_events(), start=T0, end=_at(104))
    assert {p["phase"]: p["seconds"] for p in out["phases"]} == {
        "queued": 20.0,
        "setup": 8.0,
        "training": 72.0,
        "finalize": 4.0,
    }
    assert out["total_seconds"] == 104.0


def test_phases_of_a_running_job_count_until_now():
    events = _events()[:5]  # started training at 15 s, still running
    out = phases(events, start=T0, end=_at(60))
    assert {p["phase"]: p["seconds"] for p in out["phases"]}["training"] == 45.0


def test_job_report_json():
    report = _job_report()
    json.dumps(report, default=str)
    assert report["training"]["steps_logged"] == 30 and report["training"]["last_step"] == 30
    assert report["training"]["series"]["loss"]["steps"][:3] == [1, 2, 3]
    assert report["training"]["final"]["lr"] == pytest.approx(0.0)
    man = report["manifest"]
    assert man["seed"] == 7 and man["code_version"] == "git:abc123"
    assert man["training_file"]["sha256"] == "ab" * 32
    assert man["report_generated_by"]
    assert man["wall_clock"]["total_seconds"] == 104.0
    assert report["warnings"] == [f"low data quality {XSS}"]  # the DQ warning sits with its plot
    assert [e["id"] for e in report["evaluations"]] == ["eval-1", "eval-2", "eval-3"]


def test_job_html_is_self_contained_and_escaped():
    html = render_job_html(_job_report())
    assert html.count("<svg") >= 9  # 8 training panels + the histogram + eval bars
    assert not re.search(r"https?://", html), re.findall(r"https?://\S{0,40}", html)[:5]
    assert "<script" not in html.lower().replace("&lt;script", "")
    assert XSS not in html and "&lt;script&gt;" in html
    assert "Content-Security-Policy" in html
    for text in ("ab" * 32, "git:abc123", "LC 47.0% ± 3.0", "pass@1 30.0% ± 5.0", "training"):
        assert text in html, text
    # ids are unique across the inline figures (clip paths would otherwise collide)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))


def test_report_of_a_run_directory(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    spec = {
        "base_model": "tiny-llama",
        "objective": {"name": "kto"},
        "data_source": "offline",
        "humanline": True,
        "training_file": str(data),
        "seed": 3,
    }
    (run / "checkpoints" / "step-4" / "spec.json").write_text(json.dumps(spec))
    t = T0.timestamp()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({**m, "time": t + m["step"]}) + "\n" for m in _metrics(4))
    )
    (run / "events.jsonl").write_text(
        json.dumps({"time": t - 5, "kind": "data", "message": "", "data": {}})
        + "\n"
        + json.dumps({"time": t, "kind": "started", "message": "", "data": {}})
        + "\n"
        + json.dumps({"time": t + 4, "kind": "finished", "message": "", "data": {}})
        + "\n"
        + '{"time": 1, "kind": "trunc'  # a line being written
    )
    (run / "data_quality.json").write_text(json.dumps(DQ))
    (run / "result.json").write_text(json.dumps({"status": "succeeded", "step": 4}))
    report = load_run_dir(run)
    assert report["job"]["variant"] == "offline+humanline" and report["job"]["objective"] == "kto"
    assert report["training"]["last_step"] == 4 and report["data_quality"]["n"] == 64
    assert (
        report["manifest"]["training_file"]["sha256"]
        == __import__("hashlib").sha256(data.read_bytes()).hexdigest()
    )
    assert {p["phase"]: p["seconds"] for p in report["manifest"]["wall_clock"]["phases"]} == {
        "setup": 5.0,
        "training": 4.0,
    }
    # and the CLI
    out = tmp_path / "r.html"
    subprocess.run(
        [sys.executable, "-m", "reports", str(run), "--out", str(out)],
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
    )
    assert out.read_text().startswith("<!DOCTYPE html>")


# --- comparison -----------------------------------------------------------------------------------


def _entries() -> list[dict]:
    def job(jid, objective, variant, *evals):
        return {
            "job": {"id": jid, "objective": objective, "variant": variant},
            "evaluations": list(evals),
        }

    return [
        job(
            "j-dpo-off",
            "dpo",
            "offline",
            _evaluation("e1", "instruction", 0.30, 0.02),
            _evaluation("e1b", "instruction", 0.99, 0.01, step=5),
        ),  # the final model wins over a step
        job("j-dpo-hl", "dpo", "offline+humanline", _evaluation("e2", "instruction", 0.45, 0.02)),
        job("j-dpo-on", "dpo", "online", _evaluation("e3", "instruction", 0.46, 0.02)),
        job("j-kto-off", "kto", "offline", _evaluation("e4", "instruction", 0.28, 0.02)),
        job(
            "j-kto-hl",
            "kto",
            "offline+humanline",
            _evaluation("e5", "instruction", 0.40, 0.02),
            _evaluation("e5f", "instruction", 0.1, 0.02, status="failed"),
        ),
        job("j-grpo-off", "grpo", "offline"),  # not evaluated yet
    ]


def test_comparison_picks_evaluations_and_tests_the_claims():
    doc = build_comparison(_entries(), metric="lc_win_rate")
    rows = {r["job_id"]: r for r in doc["rows"]}
    assert rows["j-dpo-off"]["evaluation_id"] == "e1" and rows["j-dpo-off"]["value"] == 0.30
    assert rows["j-kto-hl"]["evaluation_id"] == "e5"
    assert rows["j-grpo-off"]["value"] is None and any("j-grpo-off" in w for w in doc["warnings"])
    tests = {(t["objective"], t["a"], t["b"]): t for t in doc["tests"]}
    assert set(tests) == {
        ("dpo", "offline+humanline", "offline"),
        ("dpo", "online", "offline+humanline"),
        ("kto", "offline+humanline", "offline"),
    }
    big = tests[("dpo", "offline+humanline", "offline")]
    assert big["difference"] == pytest.approx(0.15) and big["p_value"] < 1e-6
    small = tests[("dpo", "online", "offline+humanline")]
    assert small["p_value"] > 0.5 and small["p_holm"] >= small["p_value"]
    with pytest.raises(ValueError):
        build_comparison(_entries(), metric="bogus")


def test_comparison_restricted_to_one_file_and_warns_on_mixed_files():
    entries = _entries()
    entries[1]["evaluations"][0]["file_id"] = "file-b"
    assert any("different files" in w for w in build_comparison(entries)["warnings"])
    only_a = build_comparison(entries, file_id="file-a")
    assert {r["job_id"]: r["value"] for r in only_a["rows"]}["j-dpo-hl"] is None


def test_comparison_html():
    html = render_comparison_html(build_comparison(_entries()))
    assert html.count("<svg") == 1 and "offline+humanline" in html and "p (Holm)" in html
    assert not re.search(r"https?://", html)


# --- evaluation pages -----------------------------------------------------------------------------


def _instruction_doc() -> dict:
    items = []
    for i in range(30):
        length, ref = 100 + 37 * i, 600
        score = 1.0 if length > ref else 0.0
        items.append(
            {
                "index": i,
                "instruction": f"Instruction {i} {XSS}",
                "output": "o" * length,
                "reference": "r" * ref,
                "length": length,
                "reference_length": ref,
                "score": score,
                "num_tokens": 10,
                "finish_reason": "stop",
                "judgements": [
                    {
                        "order": "model_first",
                        "verdict": "A" if score else "B",
                        "raw": "A",
                        "score": score,
                    },
                    {
                        "order": "reference_first",
                        "verdict": "B" if score else "A",
                        "raw": "B",
                        "score": score,
                    },
                ],
            }
        )
    return {
        "kind": "instruction",
        "evaluation": {"id": "eval-x", "job_id": "job-1", "step": None, "file_id": "file-a"},
        "metrics": {
            "win_rate": {"value": 0.5, "se": 0.09},
            "lc_win_rate": {"value": 0.48, "se": 0.1},
            "avg_length": 636.5,
            "avg_reference_length": 600.0,
            "n_items": 30,
            "n_judgements": 60,
            "ties": 0,
            "unparsed": 0,
            "first_position_rate": 0.5,
        },
        "lc_fit": {
            "coef": {"intercept": -0.1, "length": 5.0},
            "se": {"intercept": 0.5, "length": 1.0},
            "length_scale": 330.0,
            "converged": True,
        },
        "generation": {"n": 1},
        "judge": {"name": "openai:m"},
        "items": items,
    }


def _math_doc() -> dict:
    items = [
        {
            "index": i,
            "problem": f"What is {i}+{i}?" + (XSS if i == 0 else ""),
            "answer": str(2 * i),
            "level": str(1 + i % 3),
            "subject": "Arithmetic",
            "pass_at_1": float(i % 2),
            "samples": [
                {
                    "text": f"\\boxed{{{2 * i}}}" + (XSS if i == 1 else ""),
                    "correct": bool(i % 2),
                    "extracted": str(2 * i),
                    "format": 0.0,
                    "boxed": True,
                }
            ],
        }
        for i in range(10)
    ]
    return {
        "kind": "math",
        "evaluation": {"id": "eval-m", "base_model": "tiny-llama", "file_id": "file-m"},
        "metrics": {
            "pass_at_1": {"value": 0.5, "se": 0.17},
            "pass_at_n": {"value": 0.5, "se": 0.17},
            "format_rate": {"value": 0.0, "se": 0.0},
            "boxed_rate": {"value": 1.0, "se": 0.0},
            "n_items": 10,
            "n_samples": 1,
            "avg_tokens": 5.0,
        },
        "breakdown": {
            "level": {
                "1": {"value": 0.5, "se": 0.2},
                "2": {"value": 0.25, "se": 0.2},
                "3": {"value": 0.66, "se": 0.2},
            }
        },
        "generation": {"n": 1},
        "items": items,
    }


def test_evaluation_pages():
    for doc in (_instruction_doc(), _math_doc()):
        html = render_evaluation_html(doc)
        assert "<svg" in html and not re.search(r"https?://", html)
        assert XSS not in html and "&lt;script&gt;" in html  # there, escaped


# --- in a real browser ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["job", "comparison", "instruction", "math"])
def test_pages_render_in_headless_chromium_without_console_errors(tmp_path, page):
    html = {
        "job": lambda: render_job_html(_job_report()),
        "comparison": lambda: render_comparison_html(build_comparison(_entries())),
        "instruction": lambda: render_evaluation_html(_instruction_doc()),
        "math": lambda: render_evaluation_html(_math_doc()),
    }[page]()
    path = tmp_path / f"{page}.html"
    path.write_text(html, encoding="utf-8")
    result = render_in_chromium(path, tmp_path / f"{page}.png")
    assert result.console == [], result.console
    assert non_blank_fraction(result.screenshot) > 0.01  # text, tables and plots drawn


def test_the_browser_check_catches_script_errors_and_resource_loads(tmp_path):
    # The check itself must be able to fail: a broken page yields console messages.
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body><h1>x</h1>"
        '<img src="https://example.com/x.png"><script>undefinedFunction()</script></body></html>'
    )
    result = render_in_chromium(bad, tmp_path / "bad.png", size=(400, 300))
    joined = "\n".join(result.console)
    assert "undefinedFunction" in joined and "example.com" in joined
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert (
        non_blank_fraction(
            render_in_chromium(blank, tmp_path / "blank.png", size=(400, 300)).screenshot
        )
        < 0.001
    )


def test_comparison_of_jobs_without_objective_or_evaluations():
    doc = build_comparison(
        [{"job": {"id": "j1"}, "evaluations": []}, {"job": {"id": "j2", "variant": "offline"}}]
    )
    html = render_comparison_html(doc)
    assert "j1" in html and "j2" in html and doc["tests"] == []


def test_instruction_page_warns_about_a_position_biased_or_mute_judge():
    doc = _instruction_doc()
    assert "position-biased" not in render_evaluation_html(doc)
    doc["metrics"].update(first_position_rate=0.96, unparsed=12)
    html = render_evaluation_html(doc)
    assert "first answer in 96% of judgements" in html and "12 of 60 judge replies" in html


def test_run_dir_reads_the_newest_checkpoints_spec(tmp_path):
    """By step, not by name (step-10 sorts before step-9), and never one still being written."""
    specs = {"step-9": "kto", "step-10": "dpo", "step-11.tmp": "grpo"}
    for name, objective in specs.items():
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        spec = {"base_model": "tiny-llama", "objective": {"name": objective}}
        (tmp_path / "checkpoints" / name / "spec.json").write_text(json.dumps(spec))
    assert load_run_dir(tmp_path)["job"]["objective"] == "dpo"
