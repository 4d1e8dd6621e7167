"""`humanline evals`: create (from flags, --set, a spec file), list, show, report, wait."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from .conftest import EVAL_MATH, JUDGE_URL, REPORT_DOC, REPORT_HTML, math

# --- the CLI -----------------------------------------------------------------------------------


def test_cli_evals_create_list_show(cli, client, eval_queue, evals, tmp_path, instruction_file):
    path = tmp_path / "math.jsonl"
    path.write_bytes(EVAL_MATH)
    created = cli(
        "evals", "create", "--file", str(path), "--kind", "math", "--model", "tiny-llama",
        "--set", "generation.n=8", "--max-items", "3", "--json",
    )  # fmt: skip
    ev = json.loads(created.stdout)
    assert "uploaded" in created.stderr and ev["status"] == "queued"
    assert ev["config"]["generation"]["n"] == 8 and ev["config"]["max_items"] == 3
    math_file = ev["file_id"]
    assert client.files.retrieve(math_file).purpose == "eval"

    human = cli(
        "evals", "create", "--file", instruction_file, "--kind", "instruction",
        "--model", "tiny-llama", "--judge-url", JUDGE_URL, "--judge-model", "gpt-4.1",
    ).stdout  # fmt: skip
    assert human.startswith("created eval-") and "base tiny-llama" in human
    judged = human.split()[1]
    rm = json.loads(
        cli(
            "evals", "create", "--file", instruction_file, "--kind", "instruction",
            "--model", "tiny-llama", "--reward-model", "armorm", "--json",
        ).stdout
    )  # fmt: skip
    assert rm["config"]["judge"] == {"type": "reward_model", "model": "armorm"}
    spec = tmp_path / "eval.json"
    spec.write_text(json.dumps({"base_model": "tiny-llama", "kind": "math", "max_items": 1}))
    from_spec = json.loads(cli("evals", "create", "--spec", str(spec), "--file", math_file,
                               "--json").stdout)  # fmt: skip
    assert from_spec["config"]["max_items"] == 1

    bad = cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
              "--set", "generation.temperature=9", "--json", ok=False)  # fmt: skip
    error = json.loads(bad.stderr)["error"]
    assert bad.exit_code == 1 and error["status_code"] == 422
    assert error["field"] == "generation.temperature"
    bad = cli("evals", "create", "--file", math_file, "--kind", "math", ok=False)
    assert bad.exit_code == 1 and "job_id" in bad.stderr
    missing = cli("evals", "create", "--kind", "math", ok=False)
    assert missing.exit_code != 0 and "--file" in missing.output

    evals.succeed(ev["id"])
    table = cli("evals", "list").stdout
    assert "STATUS" in table and ev["id"] in table and judged in table
    assert "pass_at_1 0.5 ± 0.1 (n=4)" in table
    listed = json.loads(cli("evals", "list", "--json").stdout)
    assert [e["id"] for e in listed] == [from_spec["id"], rm["id"], judged, ev["id"]]
    assert len(json.loads(cli("evals", "list", "--limit", "2", "--json").stdout)) == 2
    assert [
        e["id"] for e in json.loads(cli("evals", "list", "--kind", "math", "--json").stdout)
    ] == [from_spec["id"], ev["id"]]
    assert [
        e["id"] for e in json.loads(cli("evals", "list", "--status", "succeeded", "--json").stdout)
    ] == [ev["id"]]

    shown = cli("evals", "show", judged).stdout
    assert judged in shown and f"openai {JUDGE_URL} gpt-4.1" in shown and "queued" in shown
    done = cli("evals", "show", ev["id"]).stdout
    assert "pass_at_1" in done and "cuda (hf engine)" in done  # where its result says it ran
    assert json.loads(cli("evals", "show", ev["id"], "--json").stdout)["status"] == "succeeded"
    gone = cli("evals", "show", "eval-nope", "--json", ok=False)
    assert gone.exit_code == 1 and json.loads(gone.stderr)["error"]["status_code"] == 404


def test_cli_evals_report_and_wait(cli, client, eval_queue, evals, math_file, tmp_path,
                                   monkeypatch):  # fmt: skip
    ev = math(client, math_file)
    early = cli("evals", "report", ev.id, ok=False)
    assert early.exit_code == 1 and "409" in early.stderr
    evals.succeed(ev.id)

    human = cli("evals", "report", ev.id).stdout
    assert "pass_at_1" in human and "0.5 ± 0.1" in human and "2 items" in human
    assert json.loads(cli("evals", "report", ev.id, "--json").stdout) == REPORT_DOC
    page = tmp_path / "eval.html"
    saved = cli("evals", "report", ev.id, "--html", str(page))
    assert page.read_bytes() == REPORT_HTML and f"wrote {page}" in saved.stderr
    assert saved.stdout == ""
    cli("evals", "report", ev.id, "-o", str(tmp_path / "eval.json"))
    assert json.loads((tmp_path / "eval.json").read_text()) == REPORT_DOC

    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url, *a, **k: opened.append(url) or True)
    cli("evals", "report", ev.id, "--open")
    assert opened[0].startswith("file://") and opened[0].endswith(".html")
    tmp_page = Path(unquote(urlparse(opened[0]).path))
    try:
        assert tmp_page.read_bytes() == REPORT_HTML
    finally:
        tmp_page.unlink()

    waited = json.loads(cli("evals", "wait", ev.id, "--json").stdout)
    assert waited["id"] == ev.id and waited["status"] == "succeeded"
    failing = math(client, math_file)
    evals.fail(failing.id, "judge down")
    result = cli("evals", "wait", failing.id, ok=False)
    assert result.exit_code == 1 and f"{failing.id} failed" in result.stdout
    assert "judge down" in result.stderr
    queued = math(client, math_file)
    slow = cli("evals", "wait", queued.id, "--timeout", "0.2", "--poll-interval", "0.05",
               "--json", ok=False)  # fmt: skip
    assert slow.exit_code == 1 and json.loads(slow.stderr)["error"]["type"] == (
        "EvaluationWaitTimeout"
    )


def test_cli_evals_create_wait(cli, auto_eval, math_file):
    waited = json.loads(
        cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
            "--wait", "--poll-interval", "0.05", "--json").stdout
    )  # fmt: skip
    assert waited["status"] == "succeeded" and waited["result"]["metrics"]["pass_at_1"]
    human = cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
                "--wait", "--poll-interval", "0.05")  # fmt: skip
    assert "waiting" in human.stdout and "succeeded: pass_at_1 0.5" in human.stdout
    assert "queued" in human.stderr and "succeeded" in human.stderr
