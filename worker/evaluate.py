"""Evaluation: one attempt at one evaluation, on the life cycle of worker.attempt.

    run_evaluation(evaluation_id, sessions, store, settings) -> outcome | None

    claim      models.evaluations.claim: the lease of models.leases, as a job's.
    prepare    download the eval file and the model (a checkpoint's `step-N/` or the job's
               exported `final/`; a base model needs nothing), write the config (its paths
               relative to the child's working directory, the attempt's: the result the team
               downloads names no server path); the launch is
               `python -m trainer.evaluation run --config ... --out ...`. A child process
               because an evaluation loads a model (its memory is returned when it exits, and
               an OOM kills the child, not the worker), may run for hours (a hard kill at
               EVAL_TIMEOUT_SECONDS), and math-verify needs a main thread. The judge's API key
               reaches it in the environment only, never in a file or the DB.
    renew      every heartbeat copies the child's progress.json into `result.progress`.
    conclude   result.json and report.html under {team}/{job}/reports/{eval}.{json,html} (a
               base-model evaluation uses {team}/{eval}/reports/...), then the row: status,
               the result summary (metrics, no per-item records) and the report keys; or
               failed with a clear message: the judge's JudgeError (after its retries and
               deadline), invalid data, a timeout, a crash (stderr tail).

Safe to call twice: a second delivery finds the row leased or finished and returns None. A
worker shutdown kills the child and gives the evaluation back to the queue.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from contract.evaluation import judge_url
from contract.runs import (
    EVAL_ERROR_FILE,
    EVAL_ERROR_TYPE,
    EVAL_EXIT_OK,
    EVAL_EXIT_TYPES,
    EVAL_PROGRESS_FILE,
    EVAL_REPORT_FILE,
    EVAL_RESULT_FILE,
    JUDGE_API_KEY_ENV,
)
from models import evaluations as eval_states
from models import jobs as job_states
from models.tables import Checkpoint, Evaluation, File, Job
from storage import IncompleteCheckpointError, ObjectNotFound, ObjectStore
from storage.keys import final_model_prefix, report_key
from worker.attempt import MAX_MESSAGE_CHARS, AttemptFailed, Launch, LeasedAttempt, claim_and_run
from worker.config import WorkerSettings
from worker.routing import Placement, trainer_env

log = logging.getLogger("humanline.worker.evaluate")

EvaluationFailed = AttemptFailed
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


# --- prepare ----------------------------------------------------------------------------------


def _prepare(
    s: Session, row: Evaluation, store: ObjectStore, settings: WorkerSettings, work: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config for trainer.evaluation.run, the evaluation header). Downloads what it needs
    into `work`, the child's working directory, and names it relative to that."""
    cfg_in = dict(row.config or {})
    file = s.get(File, row.file_id) if row.file_id else None
    if file is None or file.team_id != row.team_id:
        raise AttemptFailed("the evaluation file was deleted", "missing_file")
    data = work / "eval.jsonl"
    try:
        store.download_file(file.object_key, data)
    except ObjectNotFound:
        raise AttemptFailed(
            f"the eval file {file.id} is missing from the store", "missing_file"
        ) from None

    step = cfg_in.get("step")
    if row.job_id is None:
        source: dict[str, Any] = {"type": "base", "name": row.base_model}
    else:
        job = s.get(Job, row.job_id)
        if job is None:
            raise AttemptFailed(f"job {row.job_id} no longer exists", "missing_model")
        if row.checkpoint_id is not None or step is not None:
            ckpt = s.get(Checkpoint, row.checkpoint_id) if row.checkpoint_id is not None else None
            if ckpt is None:
                raise AttemptFailed(
                    f"job {job.id} has no checkpoint at step {step}", "missing_model"
                )
            dest = work / "model"
            try:
                store.download_dir(ckpt.object_prefix, dest)
            except IncompleteCheckpointError as exc:
                raise AttemptFailed(
                    f"checkpoint step {ckpt.step} is unusable: {exc}", "missing_model"
                ) from None
            source = {"type": "checkpoint", "path": dest.name}
        else:
            final = (job_states.exported_model(job) or {}).get("prefix")
            if not final:
                raise AttemptFailed(f"job {job.id} has no exported final model", "missing_model")
            if final != final_model_prefix(row.team_id, job.id):  # never follow a stray prefix
                raise AttemptFailed(
                    f"job {job.id} has an unexpected final model location", "missing_model"
                )
            dest = work / "model"
            try:
                store.download_dir(final, dest)
            except IncompleteCheckpointError as exc:
                raise AttemptFailed(
                    f"the final model of job {job.id} is unusable: {exc}", "missing_model"
                ) from None
            source = {"type": "dir", "path": dest.name, "base_model": job.base_model}

    config: dict[str, Any] = {
        "kind": row.kind,
        "data": data.name,
        "model": source,
        "generation": cfg_in.get("generation") or {},
        "engine": settings.EVAL_SAMPLING_ENGINE,
    }
    for key in ("prompt_template", "system_prompt", "max_items"):
        if cfg_in.get(key) is not None:
            config[key] = cfg_in[key]
    judge = cfg_in.get("judge")
    if row.kind == "instruction":
        if not judge:
            raise AttemptFailed("an instruction evaluation needs a judge", "invalid_evaluation")
        if judge.get("type") == "openai":
            url = judge_url(str(judge.get("base_url", "")))  # as the API admitted it
            if url not in settings.judge_base_urls:  # the API checked; settings may change
                raise AttemptFailed(
                    f"judge endpoint {url} is not allowed (EVAL_JUDGE_BASE_URLS)",
                    "invalid_evaluation",
                )
            config["judge"] = {
                "type": "openai",
                "base_url": url,
                "model": judge["model"],
                "timeout": settings.EVAL_JUDGE_TIMEOUT_SECONDS,
                "deadline": settings.EVAL_JUDGE_DEADLINE_SECONDS,
                "max_attempts": settings.EVAL_JUDGE_MAX_ATTEMPTS,
                "concurrency": settings.EVAL_JUDGE_CONCURRENCY,
            }
        elif judge.get("type") == "reward_model":
            path = settings.judge_reward_models.get(str(judge.get("model")))
            if path is None:
                raise AttemptFailed(
                    f"reward model {judge.get('model')!r} is not configured (EVAL_REWARD_MODELS)",
                    "invalid_evaluation",
                )
            config["judge"] = {"type": "reward_model", "path": path}
        else:
            raise AttemptFailed(
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


class EvaluationAttempt(LeasedAttempt):
    """One attempt at one evaluation."""

    kind = "evaluation"

    def __init__(
        self,
        row: Evaluation,
        worker_id: str,
        sessions: sessionmaker[Session],
        store: ObjectStore,
        settings: WorkerSettings,
        *,
        send: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        root = Path(settings.WORKER_DIR).resolve() / "evaluations" / row.id
        super().__init__(
            settings,
            sessions,
            row_id=row.id,
            worker_id=worker_id,
            number=row.attempt,
            should_stop=should_stop,
            scratch=root,
        )
        self.store = store
        self.send = send
        self.team_id, self.job_id = row.team_id, row.job_id
        self.out = self.dir / "out"
        self.deadline = 0.0

    def renew(self, s: Session) -> str | None:
        progress = None
        try:
            progress = json.loads((self.out / EVAL_PROGRESS_FILE).read_text())
        except (OSError, ValueError):
            pass
        return eval_states.heartbeat(
            s, self.row_id, self.worker_id, self.settings.LEASE_SECONDS, progress=progress
        )

    def prepare(self) -> Launch:
        self.out.mkdir(parents=True)
        with self.sessions() as s:
            row = s.get(Evaluation, self.row_id)
            assert row is not None
            config, _ = _prepare(s, row, self.store, self.settings, self.dir)
        (self.dir / "config.json").write_text(json.dumps(config, indent=1))
        self.log.info("running %s", config["kind"])
        argv = [self.settings.TRAINER_PYTHON, "-m", "trainer.evaluation", "run",
                "--config", str(self.dir / "config.json"), "--out", str(self.out)]  # fmt: skip
        env = trainer_env(Placement(1))
        env.pop(JUDGE_API_KEY_ENV, None)
        if self.settings.EVAL_JUDGE_API_KEY:
            env[JUDGE_API_KEY_ENV] = self.settings.EVAL_JUDGE_API_KEY
        self.deadline = time.monotonic() + self.settings.EVAL_TIMEOUT_SECONDS
        return Launch(argv, env, warm=self.settings.EVAL_WARM_START)

    def on_poll(self) -> None:
        if self.proc is not None and self.proc.poll() is None and time.monotonic() > self.deadline:
            raise AttemptFailed(
                f"the evaluation did not finish within {self.settings.EVAL_TIMEOUT_SECONDS:.0f} s "
                "(EVAL_TIMEOUT_SECONDS)",
                "timeout",
            )

    def conclude(self, rc: int) -> str:
        if self.stop_reason == "shutdown":
            return self.release()
        if rc != EVAL_EXIT_OK:
            raise self._failure(rc)
        doc = json.loads((self.out / EVAL_RESULT_FILE).read_text())
        owner = self.job_id or self.row_id
        json_key = report_key(self.team_id, owner, f"{self.row_id}.json")
        html_key = report_key(self.team_id, owner, f"{self.row_id}.html")
        self.store.put_file(json_key, self.out / EVAL_RESULT_FILE)
        self.store.put_file(html_key, self.out / EVAL_REPORT_FILE)
        summary = {k: doc[k] for k in SUMMARY_KEYS if k in doc}
        if isinstance(summary.get("data"), dict):  # the worker's scratch path means nothing
            summary["data"] = {k: v for k, v in summary["data"].items() if k != "path"}
        summary["report"] = {"json": json_key, "html": html_key}
        return self.finish("succeeded", result=summary)

    def _failure(self, rc: int) -> AttemptFailed:
        try:
            err = json.loads((self.out / EVAL_ERROR_FILE).read_text())
            return AttemptFailed(
                str(err.get("message", "evaluation failed"))[:MAX_MESSAGE_CHARS],
                str(err.get("type", EVAL_EXIT_TYPES.get(rc, EVAL_ERROR_TYPE))),
                exit_code=rc,
            )
        except (OSError, ValueError):  # no error.json: it crashed
            return AttemptFailed(**self.crash(rc, "the evaluation process", EVAL_ERROR_TYPE))

    def fail(self, error: dict[str, Any]) -> str:
        return self.finish("failed", error=error)

    def finish(self, status: str, *, error=None, result=None) -> str:
        error = self.public(error)
        self.end(
            lambda s: eval_states.finish(
                s, self.row_id, self.worker_id, status, error=error, result=result
            )
        )
        self.log.info("%s", status)
        return status

    def release(self) -> str:
        """Worker shutdown: back to the queue, and sent again for another worker."""
        self.end(lambda s: eval_states.release(s, self.row_id, self.worker_id))
        if self.send is not None:
            try:
                self.send(self.row_id)
            except Exception:  # the stale-queued sweep sends it later
                self.log.warning("could not re-send a released evaluation", exc_info=True)
        return "released"


def run_evaluation(
    evaluation_id: str, sessions: sessionmaker[Session], store: ObjectStore,
    settings: WorkerSettings, **options: Any,
) -> str | None:  # fmt: skip
    """Claim and run one evaluation; None when it was not ours to run. Otherwise how it ended:
    succeeded, failed, released (worker shutdown), lost (reclaimed by another worker) or
    abandoned (our storage/DB failed: the lease expires and the reaper queues it again).
    `options`: EvaluationAttempt's `send` (a released one is sent again) and `should_stop`."""
    return claim_and_run(
        "evaluation",
        sessions,
        eval_states.claim,
        lambda row, worker_id: EvaluationAttempt(
            row, worker_id, sessions, store, settings, **options
        ),
        evaluation_id,
        settings.LEASE_SECONDS,
    )
