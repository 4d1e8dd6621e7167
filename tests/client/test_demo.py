"""`make demo`'s wiring, in a second: examples/demo.py's session against a stub SDK client
(the real run trains SmolLM2 for minutes; its parts are tested where they live: the verdict in
tests/reports/test_verdict.py, the judge and the eval set in tests/evaluation/test_probe_rm.py,
reward-model evaluations through the worker in tests/evaluation/test_worker_evaluate.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace as NS

from .conftest import ROOT

JUDGEMENTS = {  # by job: the hand-computed case of tests/reports/test_verdict.py
    "job-off": [[1, 0], [0, 0], [0.5, 0.5], [0, 0]],
    "job-hl": [[1, 1], [1, 0], [0.5, 0.5], [0, 0]],
}
VERDICT = (
    "Verdict: offline+humanline vs offline: win rate 0.50 ± 0.20 vs 0.25 ± 0.14 (n=4), "
    "difference +0.25 ± 0.14 (paired, p=0.083) — not significant at this size"
)


def _load_demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StubClient:
    """The SDK calls the demo makes, recorded; evaluations of job J report JUDGEMENTS[J]."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.evals: dict[str, str] = {}
        ok = NS(status="succeeded", error=None)
        self.files = NS(upload=self._upload)
        self.jobs = NS(
            create=self._create_job,
            wait=lambda job_id, **kw: ok,
            metrics=lambda job_id: [NS(values={"loss": 0.5, "rewards/margins": 0.1})],
            checkpoints=lambda job_id: [NS(step=8)],
        )
        self.evaluations = NS(
            create=self._create_eval,
            wait=lambda eval_id, **kw: ok,
            report=lambda eval_id: NS(items=self._items(self.evals[eval_id])),
        )
        self.reports = NS(compare=self._compare)

    def _upload(self, *, file: Path, purpose: str):
        self.calls.append(("upload", {"file": Path(file).name, "purpose": purpose}))
        records = sum(1 for line in Path(file).read_text().splitlines() if line.strip())
        return NS(id=f"file-{purpose}", records=records, format="x")

    def _create_job(self, **kw):
        self.calls.append(("job", kw))
        return NS(id="job-hl" if kw["variant"] == "offline+humanline" else "job-off")

    def _create_eval(self, **kw):
        self.calls.append(("evaluation", kw))
        eval_id = f"eval-{kw['job_id']}"
        self.evals[eval_id] = kw["job_id"]
        return NS(id=eval_id)

    @staticmethod
    def _items(job_id: str) -> list[dict]:
        rows = JUDGEMENTS[job_id]
        return [
            {
                "index": i,
                "instruction": f"q{i}",
                "output": f"{'b' if (job_id, i) == ('job-hl', 1) else 'a'}{i}",
                "judgements": [{"score": s} for s in scores],
            }
            for i, scores in reversed(list(enumerate(rows)))  # the order does not matter
        ]

    def _compare(self, **kw):
        self.calls.append(("compare", kw))
        Path(kw["to"]).write_text("<html></html>")
        return Path(kw["to"])


ONLINE = "online GRPO, 100 held-out sums: base 20.0% → ..."


def _online_part(monkeypatch, line: str | None) -> list:
    """examples/demo_async.async_part (trains real models for minutes) replaced: its calls."""
    import demo_async

    calls: list = []
    monkeypatch.setattr(demo_async, "async_part", lambda *a: calls.append(a) or line)
    return calls


def test_the_demo_evaluates_both_models_and_ends_with_the_verdict(tmp_path, capsys, monkeypatch):
    demo = _load_demo()
    monkeypatch.setattr(demo, "DEMO", tmp_path)
    online = _online_part(monkeypatch, ONLINE)
    client = StubClient()
    assert demo.session(client, "tiny-llama", 3, 4, 0.0) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-2:] == [VERDICT, f"Verdict: {ONLINE}"]
    assert online == [(client, tmp_path / "testbed")]
    assert "the two models' answers differ on 1 of 4 instructions" in out
    assert f"Comparison report (win rates, curves overlaid, cost, spec differences): " \
        f"{tmp_path / 'compare.html'}" in out  # fmt: skip

    evals = [kw for name, kw in client.calls if name == "evaluation"]
    assert [e["job_id"] for e in evals] == ["job-off", "job-hl"]
    from trainer.evaluation.demo_set import MAX_NEW_TOKENS

    for e in evals:
        assert e["file_id"] == "file-eval" and e["kind"] == "instruction" and e["max_items"] == 4
        assert e["judge"] == {"type": "reward_model", "model": demo.JUDGE}
        assert e["generation"] == {"max_new_tokens": MAX_NEW_TOKENS}
    uploads = [kw for name, kw in client.calls if name == "upload"]
    assert uploads[1] == {"file": "instruction_eval_demo.jsonl", "purpose": "eval"}
    (compare,) = [kw for name, kw in client.calls if name == "compare"]
    assert compare["jobs"] == ["job-off", "job-hl"] and compare["file_id"] == "file-eval"
    assert compare["metric"] == "win_rate" and compare["format"] == "html"


def test_the_demo_stops_when_an_evaluation_fails(tmp_path, capsys, monkeypatch):
    demo = _load_demo()
    monkeypatch.setattr(demo, "DEMO", tmp_path)
    _online_part(monkeypatch, ONLINE)
    client = StubClient()
    failed = NS(status="failed", error={"message": "judge not configured"})
    client.evaluations.wait = lambda eval_id, **kw: failed
    assert demo.session(client, "tiny-llama", 3, 4, 0.0) == 1
    out = capsys.readouterr().out
    assert "failed (judge not configured)" in out and "Verdict:" not in out
