"""client.evaluations.export and `humanline evals export` (issue 35): an evaluation in
AlpacaEval's and lighteval's formats, from GET /v1/evaluations/{id}/export."""

from __future__ import annotations

import csv
import io
import json

import pytest

from humanline_client import ConflictError
from tests.reports.test_exports import _instruction_doc

from .conftest import JUDGE, math


def test_sdk_export_both_formats(client, evals, math_file, instruction_file, tmp_path):
    ev = math(client, math_file)
    with pytest.raises(ConflictError):
        client.evaluations.export(ev.id, format="lighteval")
    evals.succeed(ev.id)  # the conftest's math report: pass@1 0.5 ± 0.1
    res = client.evaluations.export(ev.id, format="lighteval")
    assert res["results"]["humanline|math_500|0"] == {
        "extractive_match": 0.5, "extractive_match_stderr": 0.1}  # fmt: skip
    assert res["provenance"]["decoding"]["n"] == 4
    assert "humanline|math|0" in client.evaluations.export(ev.id, format="lighteval", task="math")[
        "results"]  # fmt: skip

    inst = client.evaluations.create(
        file_id=instruction_file, kind="instruction", base_model="tiny-llama", judge=JUDGE
    )
    evals.succeed(inst.id, _instruction_doc())
    outputs = client.evaluations.export(inst.id, format="alpaca_eval", part="model_outputs",
                                        name="mine")  # fmt: skip
    assert [sorted(o) for o in outputs] == [["generator", "instruction", "output"]] * 4
    csv_text = client.evaluations.export(inst.id, format="alpaca_eval", part="leaderboard")
    rows = list(csv.reader(io.StringIO(csv_text)))
    assert rows[0][1] == "win_rate" and rows[1][1] == "56.25"
    saved = client.evaluations.export(inst.id, format="alpaca_eval", part="model_outputs",
                                      to=tmp_path / "model_outputs.json")  # fmt: skip
    assert json.loads(saved.read_text())[0]["output"] == "abcd"


def test_cli_evals_export(cli, client, evals, instruction_file, tmp_path):
    inst = client.evaluations.create(
        file_id=instruction_file, kind="instruction", base_model="tiny-llama", judge=JUDGE
    )
    early = cli("evals", "export", inst.id, "--format", "alpaca_eval", ok=False)
    assert early.exit_code == 1 and "409" in early.stderr
    evals.succeed(inst.id, _instruction_doc())
    full = json.loads(cli("evals", "export", inst.id, "--format", "alpaca_eval").stdout)
    assert full["leaderboard"]["job-9@step-40"]["n_total"] == 4
    out = tmp_path / "model_outputs.json"
    saved = cli("evals", "export", inst.id, "--format", "alpaca_eval", "--part",
                "model_outputs", "-o", str(out))  # fmt: skip
    assert f"wrote {out}" in saved.stderr and len(json.loads(out.read_text())) == 4
    board = cli("evals", "export", inst.id, "--format", "alpaca_eval", "--part", "leaderboard")
    assert board.stdout.startswith(",win_rate,standard_error,")
    wrong = cli("evals", "export", inst.id, "--format", "lighteval", ok=False)
    assert wrong.exit_code == 1 and "409" in wrong.stderr
