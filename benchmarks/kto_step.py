"""What scoring KTO's mismatched (x, y') rows under no_grad saves: one KTO step, before and after.

z0, KTO's reference point, is detached: no loss differentiates through the mismatched rows'
log-probs (the paper: "there is no backpropagation through z0"; HALOs ``KTOTrainer.loss``
detaches ``policy_KL_logps``). The old path ran them through the policy forward with autograd on,
in one batch with the examples (sharing each prompt's prefix pass); the new path
(``KTORecipe.no_grad_rows``, ``trainer.logps.batch_logps``) runs them in a second forward under
``torch.no_grad``. Same spec, same data, same seed: only the path differs.

Figures:
  A. step time new ÷ old, both trainers in this process, steps interleaved (who goes first
     alternates) so machine drift cancels; median over steps after the first. Target ≤ 0.85
     (a backward over half the rows: roughly 6 forward-equivalents of work instead of 8).
  B. the step's transient memory new ÷ old, one child process per path: after a warm-up step,
     freed memory is returned to the OS (glibc ``malloc_trim``) and the peak-RSS mark reset
     (``/proc/self/clear_refs``), so the peak over the next steps minus the RSS before them is
     what a step allocates (activations kept for backward, gradients, temporaries). Target ≤ 0.75
     (activations of half the rows). Peak RSS of each child is reported too, and, report only,
     the ratio without the gradient buffers (the same size on both paths). On a GPU,
     ``torch.cuda.max_memory_allocated`` replaces RSS.

Batch: 8 unpaired examples of ~64 prompt + ~64 completion tokens (and their 8 mismatched pairs;
`--batch`, `--tokens` change them), offline KTO with a frozen reference, full fine-tuning, fp32,
threads as given.
`--quick` runs the same on tiny-llama in under a minute (the targets are set for SmolLM2).
The last line printed is one JSON object with every figure and its target.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from procfs import reset_peak, status_kb
from stepbench import (
    interleaved,
    model_and_steps,
    parser,
    pin_threads,
    run_child,
    text_of,
    threads,
    user_turn,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGETS = {"step_time_ratio": 0.85, "step_memory_ratio": 0.75}


def make_data(model: str, path: Path, n: int = 64, tokens: int = 64) -> Path:
    """Unpaired examples whose templated prompt and completion are each ~`tokens` tokens."""
    from trainer.modeling import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(model))
    prompt = text_of(tok, tokens, user_turn(tok))
    answer = text_of(tok, tokens - 2, lambda s: s + (tok.eos_token or ""))
    rows = [
        {"prompt": f"{i} {prompt}", "completion": f"{i % 7} {answer}", "label": i % 2 == 0}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


BATCH = int(os.environ.get("KTO_BENCH_BATCH", "8"))  # set by --batch, read by the children too


def make_trainer(model: str, data: Path, steps: int, out: Path, path: str):
    """A KTO trainer on the new path, or patched back onto the old one (mismatched rows in the
    graph batch, scored with autograd on)."""
    from contract.spec import JobSpec
    from trainer.train import Trainer

    spec = JobSpec.model_validate(
        {
            "base_model": model,
            "training_file": str(data),
            "objective": "kto",
            "batch_size": BATCH,
            "max_steps": steps,
            "max_prompt_length": 96,
            "max_length": 192,
            "quality_sample": 0,
            "optim": {"lr": 1e-5, "warmup_ratio": 0.0},
        }
    )
    tr = Trainer(spec, out, progress=False)
    if path == "old":
        recipe = tr.recipe
        own_rows, mismatched_rows = recipe.rows, recipe.no_grad_rows
        recipe.rows = lambda ex, mb, chat: own_rows(ex, mb, chat) + mismatched_rows(ex, mb, chat)
        recipe.no_grad_rows = lambda ex, mb, chat: []
    return tr


# ---- A: interleaved step times ------------------------------------------------------------------
def step_times(model: str, data: Path, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        old = make_trainer(model, data, steps, Path(tmp) / "old", "old")
        new = make_trainer(model, data, steps, Path(tmp) / "new", "new")
        t_old, t_new, loss_gap = [], [], 0.0
        for s, m_old, m_new in interleaved(old, new, steps):
            loss_gap = max(loss_gap, abs(m_old["loss"] - m_new["loss"]))
            if s > 1:  # step 1 warms caches and allocators
                t_old.append(m_old["step_time"])
                t_new.append(m_new["step_time"])
    med_old, med_new = statistics.median(t_old), statistics.median(t_new)
    return {
        "old_step_s": med_old,
        "new_step_s": med_new,
        "step_time_ratio": med_new / med_old,
        "max_loss_gap": loss_gap,
    }


# ---- B: one child per path ----------------------------------------------------------------------
def child(model: str, data: Path, steps: int, path: str) -> dict:
    import torch

    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trainer(model, data, steps, Path(tmp), path)
        tr.step(1)  # optimizer state, allocator warm-up
        if gpu:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        else:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            base = status_kb("VmRSS") / 1024
            reset_peak()  # peak RSS := current RSS
        for s in range(2, steps + 1):
            tr.step(s)
        peak = torch.cuda.max_memory_allocated() / 2**20 if gpu else status_kb("VmHWM") / 1024
        grad_mb = sum(p.numel() * p.element_size() for p in tr.params) / 2**20
    return {
        "step_memory_mb": peak - base,
        "peak_mb": peak,
        "grad_mb": grad_mb,
        "memory": "cuda allocated" if gpu else "rss",
    }


def main() -> None:
    global BATCH
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=BATCH, help="KTO examples per step (default 8)")
    ap.add_argument(
        "--tokens", type=int, default=64, help="prompt and completion tokens each (default 64)"
    )
    args = ap.parse_args()
    pin_threads(args.threads)  # the A/B ratios: both sides (and the children) on equal threads
    if args.child:
        model, data, steps, path = args.child
        print(json.dumps(child(model, Path(data), int(steps), path)))
        return

    BATCH = args.batch
    os.environ["KTO_BENCH_BATCH"] = str(BATCH)
    model, steps = model_and_steps(args, 4, 9)
    data = make_data(model, Path(tempfile.mkdtemp()) / "unpaired.jsonl", tokens=args.tokens)
    result: dict = {
        "model": model,
        "steps": steps,
        "threads": threads(),
        "batch": f"{BATCH} KTO examples (+{BATCH} mismatched pairs) x (~{args.tokens} prompt + "
        f"~{args.tokens} completion) tokens, fp32",
    }
    result.update(step_times(model, data, steps))
    print(f"step time: {json.dumps(result)}", flush=True)
    mem_steps = min(steps, 4)
    old, new = (
        run_child(__file__, model, str(data), str(mem_steps), path) for path in ("old", "new")
    )
    result.update(
        old_step_memory_mb=old["step_memory_mb"],
        new_step_memory_mb=new["step_memory_mb"],
        step_memory_ratio=new["step_memory_mb"] / old["step_memory_mb"],
        old_peak_mb=old["peak_mb"],
        new_peak_mb=new["peak_mb"],
        memory=new["memory"],
        # report only: the step's memory without the gradient buffers both paths allocate
        grad_mb=new["grad_mb"],
        activation_memory_ratio=(new["step_memory_mb"] - new["grad_mb"])
        / (old["step_memory_mb"] - old["grad_mb"]),
    )
    result["targets"] = {k: f"<= {v}" for k, v in TARGETS.items()}
    result["met"] = {k: result[k] <= v for k, v in TARGETS.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
