"""Pairwise judges: which of two answers to an instruction is better.

Two kinds, one interface (`judge(pairs) -> list[Judgement]`, a pair being (instruction,
answer A, answer B)):

* `OpenAIJudge`: any OpenAI-compatible chat endpoint (vLLM, a hosted frontier model, or
  `tools.openai_server` over a local model). httpx with explicit timeouts;
  tenacity retries timeouts, connection errors, 408/409/429 and 5xx with exponential backoff
  and jitter, honouring `Retry-After`; other 4xx (a bad key, an unknown model) fail at once.
  Every judgement has a deadline that covers all its attempts and waits, each attempt's
  timeout is cut to what is left of it, and the first judgement that fails for good aborts
  the others, so a dead judge ends the evaluation with a `JudgeError` within about
  `deadline + timeout` seconds; it never hangs.
* `RewardModelJudge`: a local Hugging Face sequence-classification checkpoint scores each
  (instruction, answer); the higher score wins (equal scores tie). Deterministic and
  symmetric, so the two answer orders always agree.

The verdict prompt asks for one letter; anything else counts as a tie and is reported as
"unparsed", so a weak judge shows up in the report instead of silently biasing it.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type

from contract.evaluation import OPENAI_JUDGE_DEFAULTS as JUDGE

log = logging.getLogger(__name__)

Verdict = Literal["A", "B", "tie"]
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504}) | frozenset(range(520, 530))


class JudgeError(RuntimeError):
    """The judge could not give a verdict (after retries, or a non-retryable error)."""


@dataclass(frozen=True)
class Pair:
    instruction: str
    a: str
    b: str


@dataclass(frozen=True)
class Judgement:
    """`verdict` None means the judge answered but not with A, B or tie (counted as a tie)."""

    verdict: Verdict | None
    raw: str

    def score(self, model_is: Literal["A", "B"]) -> float:
        """The model's score: 1 if its answer won, 0 if it lost, 0.5 for a tie/unparsed."""
        if self.verdict is None or self.verdict == "tie":
            return 0.5
        return 1.0 if self.verdict == model_is else 0.0


class PairwiseJudge(Protocol):
    name: str

    def judge(self, pairs: Sequence[Pair]) -> list[Judgement]: ...


# --- the prompt -----------------------------------------------------------------------------

JUDGE_SYSTEM = (
    "You are a careful, impartial evaluator of AI assistant answers. You compare two answers "
    "to the same instruction and decide which one follows the instruction better: more "
    "helpful, more correct, clearer. The order in which the answers appear and their length "
    "must not influence your decision."
)
JUDGE_TEMPLATE = """## Instruction
{instruction}

## Answer A
{a}

## Answer B
{b}

Which answer is better? Reply with a single letter: A or B (or T if they are equally good)."""

_VERDICT = re.compile(r"\b(?:answer\s*)?(A|B|T|tie)\b", re.IGNORECASE)


def parse_verdict(text: str) -> Verdict | None:
    """The first standalone A/B/T ('tie') in the reply; None if there is none."""
    for match in _VERDICT.finditer(text.strip()):
        token = match.group(1)
        if token in ("A", "B"):  # a lowercase 'a' is an article, not a verdict
            return token  # type: ignore[return-value]
        if token == "T" or token.lower() == "tie":
            return "tie"
    return None


def judge_messages(pair: Pair) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {
            "role": "user",
            "content": JUDGE_TEMPLATE.format(instruction=pair.instruction, a=pair.a, b=pair.b),
        },
    ]


# --- an OpenAI-compatible endpoint ----------------------------------------------------------


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


class OpenAIJudge:
    """A judge behind POST {base_url}/chat/completions (base_url usually ends in /v1)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = JUDGE.timeout,
        connect_timeout: float = 10.0,
        max_attempts: int = JUDGE.max_attempts,
        deadline: float = JUDGE.deadline,
        backoff: float = 0.5,
        max_wait: float = 30.0,
        concurrency: int = JUDGE.concurrency,
        max_tokens: int = 16,
        temperature: float = 0.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if max_attempts < 1 or deadline <= 0 or timeout <= 0:
            raise ValueError("max_attempts >= 1, deadline > 0 and timeout > 0 are required")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.name = f"openai:{model}"
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.max_attempts, self.deadline = max_attempts, deadline
        self.backoff, self.max_wait = backoff, max_wait
        self.concurrency = max(1, concurrency)
        self.max_tokens, self.temperature = max_tokens, temperature
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            transport=transport,
            limits=httpx.Limits(max_connections=self.concurrency),
            follow_redirects=False,  # never carry the key to another host
        )
        self._abort = threading.Event()
        self.stats = {"requests": 0, "retries": 0}
        self._stats_lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one chat completion, with retries -------------------------------------------------
    def chat(self, messages: list[dict[str, str]], **params: Any) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "n": 1,
            **params,
        }
        start = time.monotonic()
        end = start + self.deadline

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            hinted = getattr(exc, "retry_after", None)
            if hinted is not None:
                return min(hinted, self.max_wait)
            base = self.backoff * 2 ** (state.attempt_number - 1)
            return min(self.max_wait, base) * random.uniform(0.5, 1.0)

        def stop(state: RetryCallState) -> bool:
            # Give up after max_attempts, or now rather than sleep past the deadline (wait is
            # computed before stop).
            if self._abort.is_set() or state.attempt_number >= self.max_attempts:
                return True
            return time.monotonic() + (state.upcoming_sleep or 0.0) >= end

        retrying = Retrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception_type(_Retryable),
            reraise=True,
            before_sleep=self._before_sleep,
        )
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts += 1
                    return self._post(body, end)
        except _Retryable as exc:
            elapsed = time.monotonic() - start
            why = "aborted (another judgement failed)" if self._abort.is_set() else "failed"
            raise JudgeError(
                f"judge {self.url} (model {self.model!r}) {why} after {attempts} attempt(s) "
                f"in {elapsed:.1f}s: {exc}"
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _before_sleep(self, state: RetryCallState) -> None:
        with self._stats_lock:
            self.stats["retries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "judge attempt %d failed (%s); retrying in %.2fs",
            state.attempt_number,
            exc,
            state.upcoming_sleep,
        )

    def _post(self, body: dict[str, Any], end: float) -> str:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise _Retryable("deadline reached")
        t = min(self.timeout, remaining)
        timeout = httpx.Timeout(t, connect=min(self.connect_timeout, t))
        with self._stats_lock:
            self.stats["requests"] += 1
        attempt_end = time.monotonic() + t
        try:
            with self._client.stream("POST", self.url, json=body, timeout=timeout) as r:
                chunks = []
                for chunk in r.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > attempt_end:  # a server dripping bytes
                        raise _Retryable(f"response not complete after {t:.1f}s")
                status, headers = r.status_code, r.headers
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out after {t:.1f}s ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Retryable(f"connection error: {type(exc).__name__}: {exc}") from None
        raw = b"".join(chunks)
        snippet = raw[:300].decode("utf-8", "replace")
        if status in RETRY_STATUSES:
            raise _Retryable(
                f"HTTP {status}: {snippet}", parse_retry_after(headers.get("retry-after"))
            )
        if not 200 <= status < 300:
            # A bad key or model fails every judgement the same way: stop them all. A redirect
            # is not followed (it would carry the key to another host).
            self._abort.set()
            raise JudgeError(f"judge {self.url} answered HTTP {status}: {snippet}")
        try:
            doc = httpx.Response(200, content=raw).json()
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(
                f"judge {self.url} returned a malformed chat completion: {snippet}"
            ) from None
        return content if isinstance(content, str) else ""

    # ---- many judgements ----------------------------------------------------------------------
    def judge_one(self, pair: Pair) -> Judgement:
        raw = self.chat(judge_messages(pair))
        return Judgement(parse_verdict(raw), raw)

    def judge(self, pairs: Sequence[Pair]) -> list[Judgement]:
        self._abort.clear()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="judge")
        futures = [pool.submit(self.judge_one, p) for p in pairs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            self._abort.set()  # in-flight judgements stop at their next retry decision
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


# --- a local reward model -------------------------------------------------------------------


class RewardModelJudge:
    """Scores (instruction, answer) with a sequence-classification model; higher wins."""

    def __init__(
        self,
        path: str | Path,
        *,
        batch_size: int = 8,
        max_length: int = 2048,
        device: str | None = None,
        tie_tolerance: float = 1e-6,
    ):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.name = f"reward_model:{Path(path).name}"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(self.device)
        self.model.eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.tie_tolerance = batch_size, max_length, tie_tolerance

    def _text(self, instruction: str, answer: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [
                    {"role": "user", "content": instruction},
                    {"role": "assistant", "content": answer},
                ],
                tokenize=False,
            )
        return f"{instruction}\n\n{answer}"

    def score(self, items: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        texts = [self._text(i, a) for i, a in items]
        out: list[float] = []
        with torch.no_grad():
            for s in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[s : s + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    add_special_tokens=False,
                ).to(self.device)
                logits = self.model(**enc).logits.float()
                out.extend(logits[:, -1].tolist())  # 1 label: the reward; k labels: the last
        return out

    def judge(self, pairs: Sequence[Pair]) -> list[Judgement]:
        unique: dict[tuple[str, str], int] = {}
        for p in pairs:
            for answer in (p.a, p.b):
                unique.setdefault((p.instruction, answer), len(unique))
        scores = self.score(list(unique))
        out = []
        for p in pairs:
            sa, sb = scores[unique[(p.instruction, p.a)]], scores[unique[(p.instruction, p.b)]]
            verdict: Verdict = (
                "tie" if abs(sa - sb) <= self.tie_tolerance else ("A" if sa > sb else "B")
            )
            out.append(Judgement(verdict, f"reward A={sa:.6g} B={sb:.6g}"))
        return out
