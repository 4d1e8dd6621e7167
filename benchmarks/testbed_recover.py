"""Per-seed results of the testbed's first studies, recovered from what the repo kept (issue 35):
studies 1 and 2 from the service's comparison report (docs/testbed_report.html, one version
per study in git history; its "Jobs" table holds each job's final pass@1 and cost, its "Spec
differences" table each job's seed, humanline, k and sample_every, which name the arm);
study 2b from docs/replication.md (its per-arm summary and the per-seed stale-32+humanline −
stale-32 differences: its per-seed accuracies were never written down).

    python benchmarks/testbed_recover.py     # writes docs/testbed/study1.json, study2.json,
                                             # study2b.json

The report may move: the source is found by `git log --stat` over every path ending in
testbed_report.html, and each file names the commit and path it came from.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import testbed_figures as tf  # noqa: E402

# the commits whose message names the study (docs/replication.md tells them apart)
STUDIES = {"study1": "the testbed's results", "study2": "testbed study 2 on a second machine"}


def report_versions() -> list[tuple[str, str, str]]:
    """(commit, subject, path) of every commit that changed a *testbed_report.html."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "log", "--stat=200", "--format=@@%H %s", "--",
         "*testbed_report.html"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found, commit, subject = [], "", ""
    for line in out.splitlines():
        if line.startswith("@@"):
            commit, _, subject = line[2:].partition(" ")
        elif "testbed_report.html" in line and "|" in line:
            found.append((commit, subject, line.split("|")[0].strip()))
    return found


def _table(page: str, heading: str) -> list[list[str]]:
    start = page.index(f"<h2>{heading}</h2>")
    body = page[start : page.index("</table>", start)]
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
         for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]  # fmt: skip


def _arm(spec: dict[str, str]) -> str:
    every = int(spec["online.sample_every"])
    if every == 1:
        return "online"
    if spec["humanline"] != "yes":
        return f"stale-{every}"
    k = int(spec["humanline_params.sync_every"])
    return f"stale-{every}+humanline" + ("" if k == 12 else f"-k{k}")


def parse_report(page: str) -> dict[str, list[dict[str, Any]]]:
    """arm → one row per seed (sorted): job, seed, final accuracy, cost."""
    diff = _table(page, "Spec differences")
    jobs = diff[0][1:]
    fields = {row[0]: dict(zip(jobs, row[1:], strict=True)) for row in diff[1:]}
    table = _table(page, "Jobs: quality and cost")
    head = table[0]
    results: dict[str, list[dict[str, Any]]] = {}
    for row in table[1:]:
        cell = dict(zip(head, row, strict=True))
        job = cell["job"]
        spec = {name: values[job] for name, values in fields.items()}
        results.setdefault(_arm(spec), []).append({
            "seed": int(spec["seed"]), "job": job, "evaluation": cell["evaluation"],
            "accuracy": round(float(cell["pass@1 (± 95% CI)"].split("%")[0]) / 100, 4),
            "wall_clock_s": float(cell["wall-clock"].rstrip(" s")),
            "samples_drawn": int(cell["completions sampled"].replace(",", "")),
            "tokens_trained": int(cell["tokens trained"].replace(",", "")),
        })  # fmt: skip
    return {arm: sorted(runs, key=lambda r: r["seed"]) for arm, runs in results.items()}


def reanalysis(results: dict[str, list[dict[str, Any]]], stales: list[int]) -> dict[str, Any]:
    """The paired analysis (testbed_figures.paired_analysis) on a study's final accuracies:
    post hoc (the studies were pre-registered with the unpaired bootstrap)."""
    return {s: tf.paired_analysis(results, s) for s in stales
            if {"online", f"stale-{s}", f"stale-{s}+humanline"} <= set(results)}  # fmt: skip


STUDY_2B = {
    "study": "2b",
    "source": "docs/replication.md, 'Study 2b' (per-arm table and the paired differences)",
    "note": "per-seed accuracies were not recorded; only the per-arm summary (mean ± SE over "
    "seeds 0-4) and, per seed 0-4, stale-32+humanline − stale-32 in points survive",
    "base_accuracy": 0.19,
    "arms": {
        "online": {"mean": 0.365, "se": 0.011, "samples_drawn": 9216, "kl_max": 0.0},
        "stale-8": {"mean": 0.353, "se": 0.018, "samples_drawn": 8320, "kl_max": 3.0},
        "stale-8+humanline": {"mean": 0.354, "se": 0.016, "samples_drawn": 8320, "kl_max": 0.8},
        "stale-32": {"mean": 0.302, "se": 0.024, "samples_drawn": 8224, "kl_max": 7.1},
        "stale-32+humanline": {"mean": 0.349, "se": 0.022, "samples_drawn": 8224, "kl_max": 4.2},
        "stale-32+humanline-k4": {"mean": 0.329, "se": 0.012, "samples_drawn": 8224, "kl_max": 1.1},
        "stale-32+humanline-k24": {
            "mean": 0.325,
            "se": 0.016,
            "samples_drawn": 8224,
            "kl_max": 4.7,
        },
    },  # fmt: skip
    "per_seed": {
        "hl_minus_stale_32_points": {"0": 4.5, "1": 4.5, "2": 7.5, "3": 2.5, "4": 4.5},
    },
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="the same recovery (git history: seconds either way)"
    )
    ap.parse_args(argv)
    out_dir = REPO / "docs" / "testbed"
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = report_versions()
    for name, marker in STUDIES.items():
        commit, subject, path = next(v for v in versions if marker in v[1])
        page = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        results = parse_report(page)
        doc = {
            "study": name.removeprefix("study"),
            "source": {"commit": commit, "path": path, "subject": subject},
            "note": "final held-out accuracy (200 sums, greedy) per job; seeds 0-4; the "
            "pre-registered analysis was unpaired, `paired_reanalysis` is post hoc",
            "arms": results,
            "paired_reanalysis": reanalysis(results, [8, 32]),
        }
        (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{name}: {sum(len(v) for v in results.values())} jobs from {commit[:7]}:{path}")
    doc2b = dict(STUDY_2B)
    hl = list(doc2b["per_seed"]["hl_minus_stale_32_points"].values())
    doc2b["paired_reanalysis"] = {"hl_minus_stale_32": tf.t_interval([v / 100 for v in hl])}
    (out_dir / "study2b.json").write_text(json.dumps(doc2b, indent=1) + "\n")
    print("study2b: per-arm summary and the paired hl − stale-32 differences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
