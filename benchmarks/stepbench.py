"""What the training-step benchmarks (kto_step.py, sync_overhead.py) share.

parser(doc)                          --quick, --model, --steps and the hidden --child
model_and_steps(args, quick, full)   the model and step count those options name
text_of(tokenizer, n_tokens, render) the shortest string of WORDS whose rendering (a chat
                                     prompt, an answer) reaches n_tokens tokens
user_turn(tokenizer)                 a render: a user message as the chat template shows it
interleaved(a, b, steps)             two trainers stepped in turn, who goes first alternating
                                     (so machine drift cancels)
run_child(script, *args)             one configuration in a process of its own (its peak
                                     memory is its own): the JSON of its last line
threads()                            the CPU threads a run was given
pin_threads(n)                       pin this process's and its children's CPU threads (torch's
                                     intra-op pool and OpenMP/MKL), default 1: a ratio of two
                                     step times is only a ratio when both ran on the same
                                     threads (memory_scale.py's read 3.04 with 2 OpenMP threads
                                     beside another job, 0.97 with 1; issue 38)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over a lazy dog while seven bright stars watch quietly".split()


def parser(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny-llama, few steps (< 60 s)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    return ap


def model_and_steps(args: argparse.Namespace, quick_steps: int, steps: int) -> tuple[str, int]:
    model = args.model or ("tiny-llama" if args.quick else "smollm2-135m-instruct")
    return model, args.steps or (quick_steps if args.quick else steps)


def text_of(tokenizer: Any, n_tokens: int, render: Callable[[str], str]) -> str:
    words: list[str] = []
    while len(tokenizer(render(" ".join(words)), add_special_tokens=False)["input_ids"]) < n_tokens:
        words.append(WORDS[len(words) % len(WORDS)])
    return " ".join(words)


def user_turn(tokenizer: Any) -> Callable[[str], str]:
    return lambda s: tokenizer.apply_chat_template(
        [{"role": "user", "content": s}], tokenize=False, add_generation_prompt=True
    )


def interleaved(a: Any, b: Any, steps: int) -> Iterator[tuple[int, dict, dict]]:
    """(step, a's metrics, b's metrics) for steps 1..steps; a goes first on odd steps."""
    for s in range(1, steps + 1):
        if s % 2:
            m_a = a.step(s)
            m_b = b.step(s)
        else:
            m_b = b.step(s)
            m_a = a.step(s)
        yield s, m_a, m_b


def run_child(script: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, script, "--child", *args], capture_output=True,
                         text=True, env=env, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))


THREADS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = 1
THREADS_HELP = "CPU threads of every measured process (default: OMP_NUM_THREADS, else 1)"


def pin_threads(n: int | None = None) -> int:
    """Pin the CPU threads of this process (torch.set_num_threads) and of the processes it
    starts (OMP_NUM_THREADS, MKL_NUM_THREADS, which they inherit) to `n`: by default the
    OMP_NUM_THREADS already set, else 1 (a neighbour's job then slows both sides of an A/B
    alike). Returns the number pinned."""
    import torch

    n = n or int(os.environ.get("OMP_NUM_THREADS") or DEFAULT_THREADS)
    for var in THREADS_ENV:
        os.environ[var] = str(n)
    torch.set_num_threads(n)
    return n
