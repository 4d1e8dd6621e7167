"""Run one evaluation: claim → prepare → evaluate (subprocess) → store → finish.

    run_evaluation(evaluation_id, session_factory, store, settings) -> outcome | None

    claim      a guarded UPDATE queued → running (or a `running` row whose heartbeat is older
               than LEASE_SECONDS: its worker died). The row's `updated_at` is the fence: every
               later write is `WHERE updated_at = <the value we last wrote>`, so a zombie attempt
               whose evaluation was reclaimed writes nothing.
    prepare    download the eval file and the model (a checkpoint's `step-N/` or the job's
               exported `final/`; a base model needs nothing), write the config.
    evaluate   `python -m trainer.evaluation run --config ... --out ...` in its own process
               group, killed with us (PR_SET_PDEATHSIG) or at EVAL_TIMEOUT_SECONDS. A child
               process because an evaluation loads a model (its memory is returned when it
               exits, and an OOM kills the child, not the worker), may run for hours (a hard kill
               at the deadline), and math-verify needs a main thread. The judge's API key
               reaches it in the environment only, never in a file or the DB. Every heartbeat
               copies its progress.json into `result.progress`.
    store      result.json and report.html under {team}/{job}/reports/{eval}.{json,html} (a
               base-model evaluation uses {team}/{eval}/reports/...), then the row: status,
               the result summary (metrics, no per-item records) and the report keys.
    finish     succeeded, or failed with a clear message: the judge's JudgeError (after its
               retries and deadline), invalid data, a timeout, a crash (stderr tail).

Safe to call twice: a second delivery finds the row running (fresh heartbeat) or finished and
returns None. Celery task (to be wired in worker/tasks.py):

    @app.task(name="worker.tasks.run_evaluation")
    def run_evaluation(evaluation_id): return evaluate.run_evaluation(evaluation_id, r.sessions,
                                                                      r.store, settings)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from models.base import utcnow
from models.tables import Checkpoint, Evaluation, File, Job
from models.settings import setting
from storage import IncompleteCheckpointError, ObjectNotFound, ObjectStore, StorageError
from storage.keys import job_prefix, report_key
from worker.routing import PROJECT_ROOT
from worker.runner import _die_with_parent, _kill

log = logging.getLogger("humanline.worker.evaluate")

API_KEY_ENV = "HUMANLINE_JUDGE_API_KEY"  # trainer.evaluation.run reads it
EXIT_MESSAGES = {2: "invalid_evaluation", 3: "judge_error"}
SUMMARY_KEYS = (
    "kind",
    "metrics",
    "lc_fit",
    "breakdown",
    "judge",
    "generation",
    "timing",
    "data",
    "code_version",
    "wall_clock_s",
    "started_at",
    "finished_at",
)


# --- settings ------------------------------------------------------------------------------------
# Evaluation settings are environment variables of the same name. Read through `setting()` so
# that once they are fields of models.settings.Settings (proposed), those win.


def allowed_judge_urls(settings: Any) -> set[str]:
    raw = setting(settings, "EVAL_JUDGE_BASE_URLS", "")
    return {u.strip().rstrip("/") for u in str(raw).split(",") if u.strip()}


def reward_models(settings: Any) -> dict[str, str]:
    """EVAL_REWARD_MODELS="name=/models/armo,other=/models/x": names users may pick → dirs."""
    out = {}
    for entry in str(setting(settings, "EVAL_REWARD_MODELS", "")).split(","):
        name, sep, path = entry.partition("=")
        if sep and name.strip() and path.strip():
            out[name.strip()] = path.strip()
    return out


class EvaluationFailed(Exception):
    def __init__(self, message: str, type: str = "evaluation_error", **details: Any):
        super().__init__(message)
        self.error = {"type": type, "message": message, **details}


class Lost(Exception):
    """The evaluation was reclaimed (or changed) under us: write nothing more."""


# --- the fenced row ------------------------------------------------------------------------------


class _Row:
    def __init__(self, sessions: sessionmaker[Session], evaluation_id: str, token: datetime):
        self.sessions, self.id, self.token = sessions, evaluation_id, token

    def write(self, **values: Any) -> None:
        """UPDATE the row if we still own it (status running, our last updated_at)."""
        now = utcnow()
        if now <= self.token:
            now = self.token + timedelta(microseconds=1)
        with self.sessions() as s:
            n = s.execute(
                update(Evaluation)
                .where(
                    Evaluation.id == self.id,
                    Evaluation.status == "running",
                    Evaluation.updated_at == self.token,
                )
                .values(updated_at=now, **values)
            ).rowcount
            s.commit()
        if n != 1:
            raise Lost(self.id)
        self.token = now


def claim(
    sessions: sessionmaker[Session], evaluation_id: str, stale_seconds: float
) -> datetime | None:
    """queued → running, or take over a running row nobody heart-beats; returns the fence."""
    now = utcnow()
    with sessions() as s:
        n = s.execute(
            update(Evaluation)
            .where(
                Evaluation.id == evaluation_id,
                or_(
                    Evaluation.status == "queued",
                    (Evaluation.status == "running")
                    & (Evaluation.updated_at < now - timedelta(seconds=stale_seconds)),
                ),
            )
            .values(status="running", updated_at=now, error=None)
        ).rowcount
        s.commit()
    return now if n == 1 else None


def stale_evaluations(
    sessions: sessionmaker[Session], *, queued_seconds: float, running_seconds: float
) -> list[str]:
    """Ids to send again (for the reaper sweep): queued longer than `queued_seconds` (a lost
    broker message) or running without a heartbeat for `running_seconds` (a dead worker).
    Sending a live one twice is harmless: `claim` lets one delivery win."""
    now = utcnow()
    with sessions() as s:
        return list(
            s.execute(
                select(Evaluation.id)
                .where(
                    or_(
                        (Evaluation.status == "queued")
                        & (Evaluation.updated_at < now - timedelta(seconds=queued_seconds)),
                        (Evaluation.status == "running")
                        & (Evaluation.updated_at < now - timedelta(seconds=running_seconds)),
                    )
                )
                .order_by(Evaluation.id)
            ).scalars()
        )


# --- prepare -------------------------------------------------------------------------------------


def _prepare(
    s: Session, row: Evaluation, store: ObjectStore, settings: Any, work: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config for trainer.evaluation.run, the evaluation header). Downloads what it needs."""
    cfg_in = dict(row.config or {})
    file = s.get(File, row.file_id) if row.file_id else None
    if file is None or file.team_id != row.team_id:
        raise EvaluationFailed("the evaluation file was deleted", "missing_file")
    data = work / "eval.jsonl"
    try:
        store.download_file(file.object_key, data)
    except ObjectNotFound:
        raise EvaluationFailed(
            f"the eval file {file.id} is missing from the store", "missing_file"
        ) from None

    step = cfg_in.get("step")
    if row.job_id is None:
        source: dict[str, Any] = {"type": "base", "name": row.base_model}
    else:
        job = s.get(Job, row.job_id)
        if job is None:
            raise EvaluationFailed(f"job {row.job_id} no longer exists", "missing_model")
        if row.checkpoint_id is not None or step is not None:
            ckpt = s.get(Checkpoint, row.checkpoint_id) if row.checkpoint_id is not None else None
            if ckpt is None:
                raise EvaluationFailed(
                    f"job {job.id} has no checkpoint at step {step}", "missing_model"
                )
            dest = work / "model"
            try:
                store.download_dir(ckpt.object_prefix, dest)
            except IncompleteCheckpointError as exc:
                raise EvaluationFailed(
                    f"checkpoint step {ckpt.step} is unusable: {exc}", "missing_model"
                ) from None
            source = {"type": "checkpoint", "path": str(dest)}
        else:
            final = ((job.result or {}).get("final_model") or {}).get("prefix")
            if not final:
                raise EvaluationFailed(f"job {job.id} has no exported final model", "missing_model")
            if final != job_prefix(row.team_id, job.id) + "final/":  # never follow a stray prefix
                raise EvaluationFailed(
                    f"job {job.id} has an unexpected final model location", "missing_model"
                )
            dest = work / "model"
            try:
                store.download_dir(final, dest)
            except IncompleteCheckpointError as exc:
                raise EvaluationFailed(
                    f"the final model of job {job.id} is unusable: {exc}", "missing_model"
                ) from None
            source = {"type": "dir", "path": str(dest), "base_model": job.base_model}

    config: dict[str, Any] = {
        "kind": row.kind,
        "data": str(data),
        "model": source,
        "generation": cfg_in.get("generation") or {},
        "engine": setting(settings, "EVAL_SAMPLING_ENGINE", "hf"),
    }
    for key in ("prompt_template", "system_prompt", "max_items"):
        if cfg_in.get(key) is not None:
            config[key] = cfg_in[key]
    judge = cfg_in.get("judge")
    if row.kind == "instruction":
        if not judge:
            raise EvaluationFailed("an instruction evaluation needs a judge", "invalid_evaluation")
        if judge.get("type") == "openai":
            url = str(judge.get("base_url", "")).rstrip("/")
            if url not in allowed_judge_urls(settings):  # the API checked; settings may change
                raise EvaluationFailed(
                    f"judge endpoint {url} is not allowed (EVAL_JUDGE_BASE_URLS)",
                    "invalid_evaluation",
                )
            config["judge"] = {
                "type": "openai",
                "base_url": url,
                "model": judge["model"],
                "timeout": setting(settings, "EVAL_JUDGE_TIMEOUT_SECONDS", 60.0),
                "deadline": setting(settings, "EVAL_JUDGE_DEADLINE_SECONDS", 600.0),
                "max_attempts": setting(settings, "EVAL_JUDGE_MAX_ATTEMPTS", 6),
                "concurrency": setting(settings, "EVAL_JUDGE_CONCURRENCY", 8),
            }
        elif judge.get("type") == "reward_model":
            path = reward_models(settings).get(str(judge.get("model")))
            if path is None:
                raise EvaluationFailed(
                    f"reward model {judge.get('model')!r} is not configured (EVAL_REWARD_MODELS)",
                    "invalid_evaluation",
                )
            config["judge"] = {"type": "reward_model", "path": path}
        else:
            raise EvaluationFailed(
                f"unknown judge type {judge.get('type')!r}", "invalid_evaluation"
            )
    header = {
        "id": row.id,
        "kind": row.kind,
        "job_id": row.job_id,
        "step": step,
        "base_model": row.base_model,
        "file_id": row.file_id,
        "judge": {k: v for k, v in (judge or {}).items()},
    }
    config["evaluation"] = header
    return config, header


# --- evaluate ------------------------------------------------------------------------------------


def _subprocess(config_path: Path, out: Path, work: Path, settings: Any, row: _Row) -> int:
    python = setting(settings, "TRAINER_PYTHON", None) or sys.executable
    argv = [
        python,
        "-m",
        "trainer.evaluation",
        "run",
        "--config",
        str(config_path),
        "--out",
        str(out),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    key = setting(settings, "EVAL_JUDGE_API_KEY", "")
    if key:
        env[API_KEY_ENV] = str(key)
    else:
        env.pop(API_KEY_ENV, None)
    timeout = float(setting(settings, "EVAL_TIMEOUT_SECONDS", 6 * 3600.0))
    beat = max(
        0.2,
        min(
            float(getattr(settings, "HEARTBEAT_SECONDS", 30.0)),
            float(getattr(settings, "LEASE_SECONDS", 120.0)) / 3,
        ),
    )
    deadline = time.monotonic() + timeout
    with open(work / "stdout.log", "wb") as so, open(work / "stderr.log", "wb") as se:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=so,
            stderr=se,
            env=env,
            cwd=work,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGKILL),  # noqa: PLW1509 - prepared before fork
        )
    try:
        while True:
            try:
                return proc.wait(timeout=beat)
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise EvaluationFailed(
                    f"the evaluation did not finish within {timeout:.0f} s (EVAL_TIMEOUT_SECONDS)",
                    "timeout",
                )
            progress = None
            try:
                progress = json.loads((out / "progress.json").read_text())
            except (OSError, ValueError):
                pass
            try:
                row.write(result={"progress": progress} if progress else None)  # heartbeat
            except (OperationalError, InterfaceError):
                log.warning("evaluation heartbeat failed; retrying", exc_info=True)
    finally:
        _kill(proc)


def _stderr_tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _failure(out: Path, work: Path, rc: int) -> EvaluationFailed:
    try:
        err = json.loads((out / "error.json").read_text())
        return EvaluationFailed(
            str(err.get("message", "evaluation failed"))[:2000],
            str(err.get("type", EXIT_MESSAGES.get(rc, "evaluation_error"))),
            exit_code=rc,
        )
    except (OSError, ValueError):
        tail = _stderr_tail(work / "stderr.log")
        last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or [""]
        what = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        return EvaluationFailed(
            f"the evaluation process {what}: {last[0]}"[:2000],
            "evaluation_error",
            exit_code=rc,
            stderr_tail=tail,
        )


# --- the whole thing -----------------------------------------------------------------------------


def run_evaluation(
    evaluation_id: str, session_factory: sessionmaker[Session], store: ObjectStore, settings: Any
) -> str | None:
    """Claim and run one evaluation; None when it was not ours to run. Otherwise how it ended:
    succeeded, failed, lost (reclaimed by another worker) or abandoned (our storage/DB failed:
    the row stays running and is reclaimed once its heartbeat is stale)."""
    stale = float(getattr(settings, "LEASE_SECONDS", 120.0))
    token = claim(session_factory, evaluation_id, stale)
    if token is None:
        log.info("evaluation %s: not claimable (finished or running elsewhere)", evaluation_id)
        return None
    row = _Row(session_factory, evaluation_id, token)
    root = Path(str(setting(settings, "WORKER_DIR", "./.humanline/work"))).resolve()
    work = root / "evaluations" / evaluation_id / f"attempt-{int(token.timestamp() * 1e6)}"
    keep = bool(getattr(settings, "KEEP_RUN_DIRS", False))
    try:
        shutil.rmtree(work.parent, ignore_errors=True)  # earlier attempts on this machine
        (work / "out").mkdir(parents=True)
        with session_factory() as s:
            ev = s.get(Evaluation, evaluation_id)
            assert ev is not None
            team_id, job_id = ev.team_id, ev.job_id
            config, _ = _prepare(s, ev, store, settings, work)
        (work / "config.json").write_text(json.dumps(config, indent=1))
        log.info("evaluation %s: running %s", evaluation_id, config["kind"])
        rc = _subprocess(work / "config.json", work / "out", work, settings, row)
        if rc != 0:
            raise _failure(work / "out", work, rc)
        doc = json.loads((work / "out" / "result.json").read_text())
        owner = job_id or evaluation_id
        json_key = report_key(team_id, owner, f"{evaluation_id}.json")
        html_key = report_key(team_id, owner, f"{evaluation_id}.html")
        store.put_file(json_key, work / "out" / "result.json")
        store.put_file(html_key, work / "out" / "report.html")
        summary = {k: doc[k] for k in SUMMARY_KEYS if k in doc}
        if isinstance(summary.get("data"), dict):  # the worker's scratch path means nothing
            summary["data"] = {k: v for k, v in summary["data"].items() if k != "path"}
        summary["report"] = {"json": json_key, "html": html_key}
        row.write(status="succeeded", result=summary, error=None, finished_at=utcnow())
        log.info("evaluation %s: succeeded", evaluation_id)
        return "succeeded"
    except EvaluationFailed as exc:
        try:
            row.write(status="failed", error=exc.error, finished_at=utcnow())
        except Lost:
            return "lost"
        log.warning("evaluation %s: failed: %s", evaluation_id, exc)
        return "failed"
    except Lost:
        log.warning("evaluation %s: reclaimed by another worker; stopping", evaluation_id)
        return "lost"
    except (StorageError, OSError, OperationalError, InterfaceError):
        # Our machinery, not the evaluation: leave it running; it is reclaimed once stale.
        log.exception("evaluation %s: worker error; it will be retried", evaluation_id)
        return "abandoned"
    except Exception as exc:  # a bug: fail loudly rather than retry forever
        log.exception("evaluation %s: unexpected error", evaluation_id)
        try:
            row.write(
                status="failed",
                error={"type": "worker_error", "message": f"{type(exc).__name__}: {exc}"},
                finished_at=utcnow(),
            )
        except Exception:
            log.exception("evaluation %s: could not record the failure", evaluation_id)
        return "failed"
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
