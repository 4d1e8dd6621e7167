"""Object keys: derived only from server-generated ids, checked before any store sees them.

Layout (one namespace per team, so a team's objects can be listed, billed and deleted
together, and a key can never name another team's object):

    {team}/files/{file}.jsonl          uploaded datasets (published by `move` after validation)
    {team}/uploads/{file}.jsonl        staging area of an upload still being validated
    {team}/{job}/step-{n}/...          checkpoint directories (with a `_COMPLETE` marker)
    {team}/{job}/final/...             the exported model of a finished job (same marker)
    {team}/{job}/reports/{name}        evaluation reports
    {team}/{job}/run/attempt-{a}/...   a multi-node attempt: the spec its ranks read, rank 0's
                                       run log (metrics.jsonl, events.jsonl, heartbeat.json ...)

Ids are validated against a strict pattern instead of being escaped: an id that needs escaping
is a bug upstream, and refusing it is cheaper than reasoning about every backend's quoting.
`check_key` is the second line of defence, applied by every store to every key it touches.
"""

from __future__ import annotations

import re

from contract.runs import CHECKPOINT_DIR_RE, FINAL_DIR, checkpoint_dir_name

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_KEY_BYTES = 1024  # S3's own limit on key length

# Path segments directly under a team that hold non-job objects. A job id equal to one of
# them would make `job_prefix(team, job)` cover the team's files, so it is refused.
_TEAM_NAMESPACES = frozenset({"files", "uploads"})
# First segment reserved for the stores' own temporary objects (StoreBase.TMP_DIR is this).
RESERVED_ROOT = ".tmp"


def check_id(value: str, what: str = "id") -> str:
    """Return `value` if it is a well-formed id, else raise ValueError."""
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise ValueError(f"invalid {what}: {value!r} (expected {ID_PATTERN.pattern})")
    return value


def _check_job_id(job_id: str) -> str:
    check_id(job_id, "job id")
    if job_id in _TEAM_NAMESPACES:
        raise ValueError(f"invalid job id: {job_id!r} is a reserved name")
    return job_id


def _check_step(step: int) -> int:
    # bool is an int subclass; True would silently become "step-1".
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"invalid step: {step!r} (expected a non-negative int)")
    return step


def team_prefix(team_id: str) -> str:
    """Everything a team owns (for deleting a team)."""
    return f"{check_id(team_id, 'team id')}/"


def file_key(team_id: str, file_id: str) -> str:
    """A published dataset file: "{team}/files/{file}.jsonl"."""
    return f"{check_id(team_id, 'team id')}/files/{check_id(file_id, 'file id')}.jsonl"


def upload_key(team_id: str, file_id: str) -> str:
    """Where an upload is streamed while it is validated; `move`d to `file_key` when valid,
    so a half-validated file is never visible under its final key."""
    return f"{check_id(team_id, 'team id')}/uploads/{check_id(file_id, 'file id')}.jsonl"


def job_prefix(team_id: str, job_id: str) -> str:
    """All objects of one job: "{team}/{job}/"."""
    return f"{check_id(team_id, 'team id')}/{_check_job_id(job_id)}/"


def checkpoint_prefix(team_id: str, job_id: str, step: int) -> str:
    """A checkpoint directory: "{team}/{job}/step-{n}/" (n not zero-padded: parse, don't sort)."""
    return f"{job_prefix(team_id, job_id)}{checkpoint_dir_name(_check_step(step))}/"


def final_model_prefix(team_id: str, job_id: str) -> str:
    """A finished job's exported model: "{team}/{job}/final/" (contract.runs.FINAL_DIR)."""
    return f"{job_prefix(team_id, job_id)}{FINAL_DIR}/"


def report_key(team_id: str, job_id: str, name: str) -> str:
    """A report: "{team}/{job}/reports/{name}"; `name` is a fixed file name chosen by our code
    (e.g. "eval.json"), still validated so a caller passing user text fails loudly."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None or ".." in name:
        raise ValueError(f"invalid report name: {name!r} (expected {NAME_PATTERN.pattern})")
    return f"{job_prefix(team_id, job_id)}reports/{name}"


def parse_checkpoint_step(prefix: str) -> int:
    """The step of a `checkpoint_prefix`; ValueError if `prefix` is not one."""
    m = re.fullmatch(rf"[^/]+/[^/]+/(?:{CHECKPOINT_DIR_RE.pattern})/", prefix)
    if m is None:
        raise ValueError(f"not a checkpoint prefix: {prefix!r}")
    return int(m.group(1))


def check_key(key: str, *, prefix: bool = False) -> str:
    """Refuse keys that could escape a store's root or mean different things on different
    backends; return `key` unchanged otherwise.

    Rules: str, not empty (unless `prefix`), at most 1024 UTF-8 bytes, no control characters
    (NUL included), no backslash, no leading '/', no empty, '.' or '..' segment, and not inside
    the stores' reserved ".tmp/" area. With `prefix=True` the empty string and a trailing '/'
    are allowed (a prefix is a string prefix, as in S3 listings).
    """
    if not isinstance(key, str):
        # ValueError, not TypeError: callers treat every refused key the same way.
        raise ValueError(f"invalid key: {key!r} (not a str)")  # noqa: TRY004
    if key == "":
        if prefix:
            return key
        raise ValueError("invalid key: empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ValueError(f"invalid key: longer than {MAX_KEY_BYTES} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(f"invalid key: {key!r} contains a control character")
    if "\\" in key:
        raise ValueError(f"invalid key: {key!r} contains a backslash")
    if key.startswith("/"):
        raise ValueError(f"invalid key: {key!r} is absolute")
    segments = key.split("/")
    if prefix and segments[-1] == "":
        segments = segments[:-1]
    for seg in segments:
        if seg in ("", ".", ".."):
            raise ValueError(f"invalid key: {key!r} has an empty, '.' or '..' segment")
    if segments and segments[0] == RESERVED_ROOT:
        raise ValueError(f"invalid key: {key!r} is in the reserved {RESERVED_ROOT}/ area")
    return key


# --- a multi-node attempt's run directory (ranks share no disk: worker.reconcile) ----------
RUN_DIR = "run"


def _check_attempt(attempt: int) -> int:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"invalid attempt: {attempt!r} (expected an int >= 1)")
    return attempt


def run_prefix(team_id: str, job_id: str, attempt: int) -> str:
    """One attempt's run directory: "{team}/{job}/run/attempt-{a}/": the spec its ranks read
    and rank 0's run log (contract.runs: metrics, events, data quality, result, heartbeat)."""
    return f"{job_prefix(team_id, job_id)}{RUN_DIR}/attempt-{_check_attempt(attempt)}/"


def run_file_key(team_id: str, job_id: str, attempt: int, name: str) -> str:
    """A file of an attempt's run directory: "{team}/{job}/run/attempt-{a}/{name}" (`name`
    a fixed file name of contract.runs, still validated)."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None or ".." in name:
        raise ValueError(f"invalid run file name: {name!r} (expected {NAME_PATTERN.pattern})")
    return run_prefix(team_id, job_id, attempt) + name


def run_spec_key(team_id: str, job_id: str, attempt: int) -> str:
    """The spec an attempt's ranks read: "{team}/{job}/run/attempt-{a}/spec.json"."""
    return run_file_key(team_id, job_id, attempt, "spec.json")
