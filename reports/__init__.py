"""Reports (DESIGN.md §4): JSON plus self-contained HTML pages with inline SVG plots.

    build_job_report / render_job_html          one job: training curves, data quality,
                                                evaluations, manifest (spec, data hash, code
                                                version, seed, wall-clock per phase)
    render_evaluation_html                      one evaluation, with per-item records
    build_comparison / render_comparison_html   across jobs: the paper's Figure 1
    load_run_dir                                a job report from a trainer run directory
    reports.verdict.paired_verdict              two models on the same items → one line
                                                (win rates, paired difference ± SE, p)
    reports.exports.export                      one evaluation in the field's formats
                                                (AlpacaEval, lighteval) with its provenance

Torch-free (stdlib, numpy, matplotlib): the API renders job and comparison pages on request,
from the DB, so they are current while a job runs and as evaluations land.
"""

from reports.compare import METRICS, build_comparison, render_comparison_html
from reports.evaluation import render_evaluation_html
from reports.job import build_job_report, load_run_dir, render_job_html
from reports.version import code_version

__all__ = [
    "METRICS",
    "build_comparison",
    "build_job_report",
    "code_version",
    "load_run_dir",
    "render_comparison_html",
    "render_evaluation_html",
    "render_job_html",
]
