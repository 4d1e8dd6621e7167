"""benchmarks/testbed_recover.py (issue 35): the per-seed JSON of studies 1, 2 and 2b, parsed
from the service's report (a table worked by hand here) and checked against the per-arm
figures docs/replication.md printed at the time."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import testbed_recover as rec  # noqa: E402

PAGE = """<h2>Jobs: quality and cost</h2><table><thead><tr><th>job</th><th>evaluation</th>
<th>pass@1 (± 95% CI)</th><th>wall-clock</th><th>tokens trained</th>
<th>completions sampled</th></tr></thead><tbody>
<tr><td>job-a</td><td>eval-a</td><td>55.0% ± 6.9</td><td>52 s</td><td>147,512</td>
<td>9,216</td></tr>
<tr><td>job-b</td><td>eval-b</td><td>50.5% ± 6.9</td><td>44 s</td><td>147,000</td>
<td>8,224</td></tr>
<tr><td>job-c</td><td>eval-c</td><td>49.0% ± 6.9</td><td>43 s</td><td>147,001</td>
<td>8,224</td></tr>
</tbody></table>
<h2>Spec differences</h2><table><thead><tr><th>field</th><th>job-a</th><th>job-b</th>
<th>job-c</th></tr></thead><tbody>
<tr><td>humanline</td><td>no</td><td>yes</td><td>yes</td></tr>
<tr><td>humanline_params.sync_every</td><td>12</td><td>12</td><td>4</td></tr>
<tr><td>online.sample_every</td><td>1</td><td>32</td><td>32</td></tr>
<tr><td>seed</td><td>3</td><td>3</td><td>3</td></tr></tbody></table>"""


def test_parse_report_names_arms_from_the_spec_differences():
    out = rec.parse_report(PAGE)
    assert set(out) == {"online", "stale-32+humanline", "stale-32+humanline-k4"}
    assert out["online"] == [{"seed": 3, "job": "job-a", "evaluation": "eval-a",
                              "accuracy": 0.55, "wall_clock_s": 52.0, "samples_drawn": 9216,
                              "tokens_trained": 147512}]  # fmt: skip
    assert out["stale-32+humanline"][0]["accuracy"] == 0.505


@pytest.mark.parametrize(
    ("study", "means"),
    [("study1", {"online": 58.3, "stale-8": 58.6, "stale-32": 50.8, "stale-32+humanline": 50.6}),
     ("study2", {"online": 39.3, "stale-8": 37.1, "stale-32": 31.9, "stale-32+humanline": 35.1})],
)  # fmt: skip
def test_committed_per_seed_results_match_the_figures_printed_then(study, means):
    doc = json.loads((REPO / "docs" / "testbed" / f"{study}.json").read_text())
    for arm, mean in means.items():
        runs = doc["arms"][arm]
        assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4]
        assert 100 * statistics.fmean(r["accuracy"] for r in runs) == pytest.approx(mean, abs=0.05)
    if study == "study2":  # replication.md: hl − stale-32 by seed +3.5, +3.5, +3.5, +1.5, +4.0
        hl, st = doc["arms"]["stale-32+humanline"], doc["arms"]["stale-32"]
        pairs = zip(hl, st, strict=True)
        diffs = [round(100 * (a["accuracy"] - b["accuracy"]), 1) for a, b in pairs]
        assert diffs == [3.5, 3.5, 3.5, 1.5, 4.0]


def test_study_2b_keeps_what_was_written_down():
    doc = json.loads((REPO / "docs" / "testbed" / "study2b.json").read_text())
    assert doc["arms"]["stale-32"]["mean"] == 0.302
    hl = doc["paired_reanalysis"]["hl_minus_stale_32"]
    assert hl["mean"] == pytest.approx(0.047) and hl["se"] == pytest.approx(0.008)
