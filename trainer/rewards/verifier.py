"""``math_accuracy``: is the completion's final answer equal to the record's ``answer``?

Two steps. :func:`extract_answer` picks the final answer out of the completion here, with plain
regexes (linear time): the content of the last ``<answer>…</answer>``, else the last
``\\boxed{…}``, else the last number. Then math-verify parses both sides and compares them
symbolically (``1/2 == 0.5 == \\frac{1}{2}``, ``5 cm == 5``, ``50\\% == 50``) in a child process.

Why a child: sympy can spend unbounded time on an adversarial answer (``9^{9^{9^{9}}}`` never
returns), and math-verify's built-in timeout relies on ``signal.alarm``, which raises outside
the main thread — where an online trainer may well score. The child runs with math-verify's
timeouts off, the parent waits at most ``timeout_s`` per answer and kills and restarts the
child on overrun (the answer scores 0). Costs: ~1 s to start the child once, a pipe round trip
per answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 200  # longer "final answers" are prose; their last number is used instead
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A number: optional sign (not after a word/closing char, so "10-3" is not "-3"), thousands
# separators, decimals, an optional "/ d" fraction and percent sign.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])[-−])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*%)?"
)
_CHILD = Path(__file__).with_name("_verify_child.py")


def extract_answer(completion: str) -> str | None:
    """The completion's final answer as a short string, or None if it states none."""
    tagged = _ANSWER.findall(completion)
    if tagged:
        answer = tagged[-1].strip()
        if not answer:
            return None
        return answer if len(answer) <= MAX_ANSWER_CHARS else _last_number(answer)
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed if 0 < len(boxed) <= MAX_ANSWER_CHARS else None
    return _last_number(completion)


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip().replace("−", "-") if numbers else None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``), braces matched."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1].strip() if depth == 0 else None


class VerifierProcess:
    """A long-lived math-verify child with a per-answer deadline; thread-safe."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        start_timeout_s: float = 120.0,
        memory_limit_bytes: int = 4 << 30,
    ):
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self.timeouts = 0  # answers that overran the deadline (for logging)
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def check(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        with self._lock:
            return [self._check_one(gold, candidate) for gold, candidate in pairs]

    def _check_one(self, gold: str, candidate: str) -> bool:
        proc = self._ensure_started()
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps([gold, candidate]) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:  # the child died (e.g. over its memory limit) since last time
            self._kill()
            return False
        line = self._readline(proc, self.timeout_s)
        if line is None:
            self.timeouts += 1
            log.warning(
                "math-verify gave up after %.1f s on %r; scoring 0", self.timeout_s, candidate[:80]
            )
            self._kill()
            return False
        return line.strip() == "1"

    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        cmd = [sys.executable, "-P", str(_CHILD), str(self.memory_limit_bytes)]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        line = self._readline(self._proc, self.start_timeout_s)
        message = json.loads(line) if line else {"error": "no answer from the child"}
        if not message.get("ready"):
            self._kill()
            raise RuntimeError(f"math-verify child failed to start: {message.get('error')}")
        return self._proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout_s: float) -> str | None:
        """One reply line, or None on deadline or EOF. Strict request/reply, so the text
        buffer never holds a second line that ``select`` on the fd could not see."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                line = proc.stdout.readline()
                return line or None

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __del__(self) -> None:  # best effort; the child also exits when its stdin closes
        with contextlib.suppress(Exception):
            self._kill()


class MathAccuracy:
    """1.0 when the extracted final answer verifies against ``record["answer"]``, else 0.0."""

    def __init__(self, timeout_s: float = 5.0, answer_key: str = "answer"):
        self.answer_key = answer_key
        self.verifier = VerifierProcess(timeout_s=timeout_s)

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        golds = []
        for i, record in enumerate(records):
            if record.get(self.answer_key) is None:
                raise ValueError(
                    f"math_accuracy needs an {self.answer_key!r} column; record {i} has none"
                )
            golds.append(str(record[self.answer_key]))
        answers = [extract_answer(text) for text in completions]
        pairs = enumerate(zip(golds, answers, strict=False))
        todo = [(i, (g, a)) for i, (g, a) in pairs if a is not None]
        verdicts = self.verifier.check([pair for _, pair in todo])
        scores = [0.0] * len(completions)
        for (i, _), ok in zip(todo, verdicts, strict=False):
            scores[i] = 1.0 if ok else 0.0
        return scores

    def close(self) -> None:
        self.verifier.close()
