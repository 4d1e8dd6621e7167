"""One evaluation from a config file to a result directory: the worker's entry point.

    python -m trainer.evaluation run --config eval.json --out DIR

config (JSON):
    kind           "instruction" | "math"
    data           path of an eval_instruction / eval_math JSONL file
    model          a model source (trainer.evaluation.generation)
    generation     {"n", "temperature", "top_p", "max_new_tokens", "seed"} (kind defaults)
    judge          instruction only: {"type": "openai", "base_url", "model", "timeout"?,
                   "max_attempts"?, "deadline"?, "concurrency"?, "max_tokens"?} or
                   {"type": "reward_model", "path"}; the API key is read from the
                   environment variable HUMANLINE_JUDGE_API_KEY, never from the file
    prompt_template, system_prompt   math only ("{problem}" is replaced by the problem)
    engine         sampling engine: "hf" (default), "vllm" or "auto" (trainer.sampling)
    max_items, device, max_batch_rows, evaluation (a header copied into the result)

DIR receives progress.json (rewritten as it goes), result.json and report.html on success,
error.json ({"type", "message"}) on failure. Exit codes: 0 ok, 2 invalid config or data,
3 judge failure, 1 anything else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contract.data import read_jsonl
from contract.evaluation import EVAL_FILE_FORMAT
from contract.evaluation import OPENAI_JUDGE_DEFAULTS as JUDGE
from contract.runs import (  # the files, exit codes and key variable the worker relies on
    EVAL_ERROR_FILE,
    EVAL_EXIT_TYPES,
    EVAL_PROGRESS_FILE,
    EVAL_REPORT_FILE,
    EVAL_RESULT_FILE,
    JUDGE_API_KEY_ENV,
)
from contract.runs import EVAL_EXIT_ERROR as EXIT_ERROR
from contract.runs import EVAL_EXIT_INVALID as EXIT_INVALID
from contract.runs import EVAL_EXIT_JUDGE as EXIT_JUDGE
from contract.runs import EVAL_EXIT_OK as EXIT_OK

log = logging.getLogger(__name__)


class InvalidEvaluation(ValueError):
    """The config or the data cannot be evaluated (not worth retrying)."""


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str, allow_nan=True))
    tmp.replace(path)


def _write_error(out_dir: Path, code: int, message: str, **detail: Any) -> None:
    """error.json: its type is the one contract.runs gives the exit code the child returns."""
    error = {"type": EVAL_EXIT_TYPES[code], "message": message, **detail}
    _write_json(out_dir / EVAL_ERROR_FILE, error)


def make_judge(cfg: dict[str, Any], api_key: str | None):
    from trainer.evaluation.judges import OpenAIJudge, RewardModelJudge

    kind = cfg.get("type")
    if kind == "openai":
        return OpenAIJudge(
            cfg["base_url"],
            cfg["model"],
            api_key,
            timeout=float(cfg.get("timeout", JUDGE.timeout)),
            max_attempts=int(cfg.get("max_attempts", JUDGE.max_attempts)),
            deadline=float(cfg.get("deadline", JUDGE.deadline)),
            concurrency=int(cfg.get("concurrency", JUDGE.concurrency)),
            max_tokens=int(cfg.get("max_tokens", 16)),
        )
    if kind == "reward_model":
        return RewardModelJudge(cfg["path"], batch_size=int(cfg.get("batch_size", 8)))
    raise InvalidEvaluation(f"unknown judge type {kind!r}; expected openai or reward_model")


def load_records(config: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kind = config.get("kind")
    if kind not in EVAL_FILE_FORMAT:
        raise InvalidEvaluation(f"kind must be instruction or math, got {kind!r}")
    path = Path(config["data"])
    try:
        fmt, records = read_jsonl(str(path), allowed=(EVAL_FILE_FORMAT[kind],))
    except (ValueError, OSError) as exc:
        raise InvalidEvaluation(f"eval data: {exc}") from None
    raw = path.read_bytes()
    if config.get("max_items"):
        records = records[: int(config["max_items"])]
    info = {
        "path": str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "format": fmt,
        "records": len(records),
    }
    return records, info


def run_config(config: dict[str, Any], out_dir: Path, api_key: str | None = None) -> dict[str, Any]:
    """Run the evaluation a config describes; returns the result document (also written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    records, data_info = load_records(config)
    state = {"phase": "loading", "done": 0, "total": len(records), "started_at": started}

    def progress(phase: str, done: int, total: int) -> None:
        state.update(phase=phase, done=done, total=total, updated_at=time.time())
        _write_json(out_dir / EVAL_PROGRESS_FILE, state)

    progress("loading", 0, len(records))
    judge = None
    if config["kind"] == "instruction":
        if not config.get("judge"):
            raise InvalidEvaluation("an instruction evaluation needs a judge")
        judge = make_judge(config["judge"], api_key)
        if hasattr(judge, "chat") and config.get("preflight", True):
            # Fail in seconds, not after an hour of generation, when the judge is unreachable.
            judge.chat([{"role": "user", "content": "Reply with the letter A."}], max_tokens=1)
    # torch, the model and matplotlib load only now: a bad judge fails in a second or two.
    from reports import code_version, render_evaluation_html
    from trainer.evaluation.generation import Generator
    from trainer.evaluation.instruction import evaluate_instructions
    from trainer.evaluation.math import DEFAULT_PROMPT, evaluate_math

    engine = config.get("engine", "hf")
    generator = Generator.from_source(
        config["model"],
        device=config.get("device"),
        engine=engine,
        max_batch_rows=int(config.get("max_batch_rows", 16)),
    )
    gen = dict(config.get("generation") or {})
    if config["kind"] == "instruction":
        assert judge is not None  # made above, before the model loads
        doc = evaluate_instructions(
            records, generator.generate, judge, generation=gen, progress=progress
        )
    else:
        doc = evaluate_math(
            records,
            generator.generate,
            generation=gen,
            prompt_template=config.get("prompt_template") or DEFAULT_PROMPT,
            system_prompt=config.get("system_prompt"),
            progress=progress,
        )
    finished = time.time()
    # where the samples came from, beside how they were drawn (kept in the API's summary)
    doc["generation"] = {**doc["generation"], "engine": engine, "device": generator.device}
    doc.update(
        evaluation=config.get("evaluation") or {},
        model={k: v for k, v in config["model"].items() if k != "path"},
        data=data_info,
        code_version=code_version(),
        started_at=datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        finished_at=datetime.fromtimestamp(finished, UTC).isoformat(timespec="seconds"),
        wall_clock_s=round(finished - started, 3),
    )
    _write_json(out_dir / EVAL_RESULT_FILE, doc)
    (out_dir / EVAL_REPORT_FILE).write_text(render_evaluation_html(doc), encoding="utf-8")
    progress("done", len(records), len(records))
    if judge is not None and hasattr(judge, "close"):
        judge.close()
    return doc


def main(config_path: Path, out_dir: Path) -> int:
    from trainer.evaluation.judges import JudgeError

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        config = json.loads(Path(config_path).read_text())
        run_config(config, out_dir, api_key=os.environ.get(JUDGE_API_KEY_ENV) or None)
        return EXIT_OK
    except JudgeError as exc:
        _write_error(out_dir, EXIT_JUDGE, str(exc))
        log.error("%s", exc)
        return EXIT_JUDGE
    except (InvalidEvaluation, KeyError, json.JSONDecodeError) as exc:
        what = f"missing config field {exc}" if isinstance(exc, KeyError) else str(exc)
        _write_error(out_dir, EXIT_INVALID, what)
        log.error("%s", what)
        return EXIT_INVALID
    except Exception as exc:
        detail = {"traceback": traceback.format_exc()[-4000:]}
        _write_error(out_dir, EXIT_ERROR, f"{type(exc).__name__}: {exc}", **detail)
        log.exception("evaluation failed")
        return EXIT_ERROR
