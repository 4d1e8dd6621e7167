"""What a job or an evaluation must pass before its row is written (DESIGN.md §6).

`admit_job` is the one door for training jobs, /v1/jobs and the OpenAI-shaped
/v1/fine_tuning/jobs alike: the operator's allow-lists and caps (api.caps), the team's training
file, metadata, the batch fitted to the data, and the team's quota, last. `check_base_model`,
`check_eval_file` and `check_judge` serve /v1/evaluations and a job's `evaluations` alike.
Every refusal is an api_error naming the field; nothing is committed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session

from api.caps import check_caps, check_max_runtime, check_memory, check_total_steps
from api.errors import api_error
from api.estimates import estimate_for
from api.owned import owned
from contract.estimate import JobEstimate
from contract.evaluation import EVAL_FILE_FORMAT, EvalRequest, judge_url
from contract.items import MAX_PROFILED_FIELDS, FieldProfile
from contract.spec import JobSpec
from models import jobs as job_states
from models.settings import Settings
from models.tables import TRAINING_PURPOSES, File, Job

_META_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_META_VALUE = 512


@dataclass(frozen=True)
class CheckedJob:
    """A spec that passed every check of `check_job`: the spec to store (resolved, batch fitted
    to the data), its steps, the training file's checked columns, and the warnings to record
    as (message, field)."""

    spec: JobSpec
    steps: int
    training_file: Row
    warnings: tuple[tuple[str, str], ...]

    def estimate(self, settings: Settings) -> JobEstimate | None:
        f = self.training_file
        return estimate_for(self.spec, settings, f.format, f.bytes or 0, f.records or 0)


def check_job(spec: JobSpec, team_id: str, session: Session, settings: Settings) -> CheckedJob:
    """Every check a job's spec must pass (all but the team's quota), writing nothing: the one
    validation of POST /v1/jobs, /v1/fine_tuning/jobs and POST /v1/jobs/estimate."""
    check_base_model(spec.base_model, settings)
    check_caps(spec, settings)
    max_runtime = check_max_runtime(spec, settings)
    _check_metadata(spec.metadata, settings.MAX_METADATA_KEYS)
    _check_reward_models(spec, settings.allowed_reward_models)
    if len(spec.evaluations) > settings.MAX_EVALS_PER_TEAM:  # could never all be queued
        raise api_error(
            422,
            f"at most {settings.MAX_EVALS_PER_TEAM} evaluations per team are queued at once",
            field="evaluations",
        )
    for i, ev in enumerate(spec.evaluations):  # checked now, run when the job succeeds
        check_eval_file(session, team_id, ev, where=f"evaluations.{i}.")
        check_judge(ev, settings, where=f"evaluations.{i}.")
    training_file = _training_file(session, team_id, spec)
    _check_reward_fields(spec, training_file)
    # Stored and returned resolved: every default the run will use is a value, never null.
    # (max_runtime stored too: the worker holds the job to it)
    resolved = spec.resolved().model_copy(update={"max_runtime": max_runtime})
    examples = resolved.examples_in(training_file.format, training_file.records or 0)
    resolved, warning = _fit_batch(spec, resolved, examples, training_file.id)
    steps = resolved.total_steps(examples)
    check_total_steps(steps, resolved, settings)
    unestimated = check_memory(
        resolved, settings, training_file.bytes or 0, training_file.records or 0
    )
    warnings: tuple[tuple[str, str], ...] = ((warning, "batch_size"),) if warning else ()
    if unestimated:
        warnings += ((unestimated, "base_model"),)
    return CheckedJob(resolved, steps, training_file, warnings)


def admit_job(spec: JobSpec, team_id: str, session: Session, settings: Settings) -> Job:
    """`admit`'s job row (the OpenAI-shaped route's door)."""
    return admit(spec, team_id, session, settings)[0]


def admit(
    spec: JobSpec, team_id: str, session: Session, settings: Settings
) -> tuple[Job, JobEstimate | None]:
    """Check a spec against the operator's settings and the team's files and quota
    (`check_job`, then the quota), and add its job row (`queued`, not yet committed) with its
    warnings as events and its cost estimate in its `created` event. Both job routes (ours
    and the OpenAI-shaped one) admit jobs here; each commits and enqueues after writing its
    own response body. Returns the row and its estimate (None: the base model's shape is not
    readable here)."""
    checked = check_job(spec, team_id, session, settings)
    estimate = checked.estimate(settings)  # before any row: a failure here writes nothing
    job = job_states.create_job(
        session,
        team_id=team_id,
        spec=checked.spec.model_dump(mode="json"),
        metadata=spec.metadata,
        training_file_id=checked.training_file.id,
        total_steps=checked.steps,
        estimate=None if estimate is None else estimate.model_dump(mode="json"),
    )
    for message, field in checked.warnings:
        job_states.add_event(session, job.id, "warning", message, {"field": field})
    # The quota check comes last: near the limit it locks the team's row until the caller's
    # commit, so concurrent creates of one team wait for two statements, not the route.
    limit = settings.MAX_JOBS_PER_TEAM
    if not job_states.within_quota(session, team_id, limit):
        session.rollback()
        raise api_error(
            429,
            f"at most {limit} active jobs per team; wait for one to finish or cancel one",
            headers={"x-should-retry": "false"},  # a quota, not load: retrying cannot help
        )
    return job, estimate


def _fit_batch(
    spec: JobSpec, resolved: JobSpec, examples: int, file_id: str
) -> tuple[JobSpec, str]:
    """A batch larger than an offline file never trains one silent step: a batch the user
    set is refused (422, naming both numbers); a default one shrinks to the data, with a
    warning event. Returns the spec to store and the warning ("" when none)."""
    per_step = resolved.examples_per_batch
    if resolved.data_source != "offline" or examples >= per_step:
        return resolved, ""
    unit, group = resolved.batch_unit, resolved.group_size
    if spec.batch_size is not None:  # the user's (null, like unset, means the default)
        raise api_error(
            422,
            f"batch_size {resolved.global_batch_size} needs {per_step} training examples per "
            f"step but file {file_id} has {examples}: lower batch_size (in {unit}) or add data",
            field="batch_size",
        )
    # a batch must split into whole groups per micro-step
    unit_step = group * (resolved.grad_accum or 1)
    fitted = (examples * group) // unit_step * unit_step
    if fitted < 1:
        raise api_error(
            422,
            f"file {file_id} has {examples} training examples: too few for grad_accum "
            f"{resolved.grad_accum or 1}",
            field="training_file",
        )
    body = resolved.model_dump(mode="json") | {"batch_size": fitted}
    message = (
        f"the default batch of {resolved.global_batch_size} {unit} is larger than the "
        f"{examples} examples of file {file_id}; training with batch_size {fitted}"
    )
    return JobSpec.model_validate(body), message


def check_meta_key(key: str, field: str) -> None:
    """A metadata key, in a spec or in a list's `metadata[key]=` filter."""
    if not _META_KEY.match(key):
        raise api_error(422, "metadata keys are 1-64 characters of A-Z a-z 0-9 _ . -", field=field)


def _check_metadata(metadata: dict[str, str], limit: int) -> None:
    if len(metadata) > limit:
        raise api_error(422, f"at most {limit} metadata keys", field="metadata")
    for key, value in metadata.items():
        check_meta_key(key, f"metadata.{key}")
        if len(value) > MAX_META_VALUE:
            raise api_error(
                422,
                f"metadata values are at most {MAX_META_VALUE} characters",
                field=f"metadata.{key}",
            )


def _check_reward_models(spec: JobSpec, allowed: tuple[str, ...]) -> None:
    """Reward-model checkpoints live on the workers: users name one an operator allowed."""
    for i, reward in enumerate(spec.online.rewards if spec.online else []):
        path = reward.options.get("path")
        if reward.name == "reward_model" and path not in allowed:
            raise api_error(
                422,
                f"reward model {path!r} is not allowed; "
                f"one of: {', '.join(allowed) or '(none configured)'}",
                field=f"online.rewards.{i}.options.path",
            )


def _check_reward_fields(spec: JobSpec, file: Row) -> None:
    """Every field a reward reads (a grader's `{{item.<field>}}`) is on every line of the
    training file, as its upload profiled it; else 422 naming the field and the first line
    without it. (A file uploaded before profiles were kept is not checked here.)"""
    profile = FieldProfile.from_json(file.item_fields)
    if profile is None or spec.online is None:
        return
    for i, reward in enumerate(spec.online.rewards):
        for name in reward.item_paths():
            if not profile.checkable(name):
                raise api_error(
                    422,
                    f"reward {reward.name} reads {{{{item.{name}}}}}, which cannot be checked "
                    f"on every line of file {file.id}: its first line holds more than "
                    f"{MAX_PROFILED_FIELDS} fields (nested ones counted); read a top-level "
                    "field, or upload lines with fewer fields",
                    field=f"online.rewards.{i}.options",
                )
            line = profile.first_line_without(name)
            if line is not None:
                raise api_error(
                    422,
                    f"reward {reward.name} reads {{{{item.{name}}}}} but line {line} of file "
                    f"{file.id} has no field {name!r}: add {name!r} to every line, or read a "
                    "field every line has",
                    field=f"online.rewards.{i}.options",
                )


_TRAINING_FILE = select(
    File.id,
    File.team_id,
    File.purpose,
    File.status,
    File.format,
    File.records,
    File.bytes,
    File.item_fields,
).where(File.id == bindparam("file_id"))


def _training_file(session: Session, team_id: str, spec: JobSpec) -> Row:
    """The file row's checked columns (a statement built once: this runs on every create)."""
    row = session.execute(_TRAINING_FILE, {"file_id": spec.training_file}).one_or_none()
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no file {spec.training_file!r}", field="training_file")
    if row.purpose not in TRAINING_PURPOSES:
        raise api_error(
            422,
            f"file {row.id} was uploaded with purpose {row.purpose!r}; "
            "training files need purpose 'train' (or OpenAI's 'fine-tune')",
            field="training_file",
        )
    if row.status != "processed":
        raise api_error(422, f"file {row.id} is {row.status}, not processed", field="training_file")
    formats = spec.training_formats
    if row.format not in formats:
        hint = (  # what a prompt line looks like, ours or OpenAI's reinforcement one
            '; prompt data is lines of {"prompt": ..., "answer": ...} or OpenAI\'s '
            '{"messages": [...ending with the user turn], <the fields the grader reads>}'
            if "prompt" in formats
            else ""
        )
        raise api_error(
            422,
            f"{spec.objective.name} ({spec.data_source}) trains on {' or '.join(formats)} "
            f"data; file {row.id} is {row.format}{hint}",
            field="training_file",
        )
    return row


def check_base_model(name: str | None, settings: Settings) -> None:
    """Only base models the operator allows (a job's and an evaluation's alike)."""
    if name not in settings.allowed_base_models:
        allowed = ", ".join(settings.allowed_base_models)
        raise api_error(422, f"unknown base_model {name!r}; one of {allowed}", field="base_model")


# --- evaluations: an evaluation's own checks, and those of a job's `evaluations` -------------


def check_eval_file(session: Session, team_id: str, body: EvalRequest, where: str = "") -> File:
    """The team's processed eval file of the request's kind; `where` prefixes error fields."""
    row = owned(session, File, body.file_id, team_id, field=f"{where}file_id")
    if row.purpose != "eval":
        raise api_error(
            422,
            f"file {row.id} was uploaded with purpose {row.purpose!r}; evaluations need 'eval'",
            field=f"{where}file_id",
        )
    if row.status != "processed":
        raise api_error(
            422, f"file {row.id} is {row.status}, not processed", field=f"{where}file_id"
        )
    want = EVAL_FILE_FORMAT[body.kind]
    if row.format != want:
        raise api_error(
            422,
            f"a {body.kind} evaluation needs a {want} file; file {row.id} is {row.format}",
            field=f"{where}file_id",
        )
    return row


def check_judge(body: EvalRequest, settings: Settings, where: str = "") -> dict[str, Any] | None:
    """The judge as stored, if the operator allows it; `where` prefixes error fields."""
    judge = body.judge
    if judge is None:
        return None
    if judge.type == "openai":
        url = judge_url(judge.base_url)
        allowed = settings.judge_base_urls
        if url not in allowed:
            # The server's API key goes to this URL: only operator-approved endpoints.
            raise api_error(
                422,
                f"judge endpoint {url!r} is not allowed"
                + (
                    f"; allowed: {', '.join(sorted(allowed))}"
                    if allowed
                    else "; the operator has allowed none (EVAL_JUDGE_BASE_URLS)"
                ),
                field=f"{where}judge.base_url",
            )
        return body.stored_judge()
    names = set(settings.judge_reward_models)
    if judge.model not in names:
        raise api_error(
            422,
            f"unknown reward model {judge.model!r}"
            + (
                f"; one of {', '.join(sorted(names))}"
                if names
                else "; none is configured (EVAL_REWARD_MODELS)"
            ),
            field=f"{where}judge.model",
        )
    return body.stored_judge()
