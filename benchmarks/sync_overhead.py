"""What humanline syncing costs, and how our DPO step compares with TRL's.

Figures (targets from the trainer issue):
  A. step time offline+humanline (k=1) ÷ offline, LoRA and full fine-tuning (≤ 1.03): both
     trainers live in this process and their steps are interleaved, so machine drift cancels.
     Also the sync's own time (our lookahead refresh) and, for scale, one in-place copy of the
     trainable weights (what a copy-based sync would add).
  B. peak RSS offline+humanline ÷ offline (LoRA ≤ 1.02; full ≤ 1.0): one child process each.
  C. our humanline DPO step ÷ TRL DPOTrainer at defaults with sync_ref_model=True,
     ref_model_sync_steps=1, ref_model_mixup_alpha=1.0 (≤ 0.70), full fine-tuning, same batch:
     interleaved in one process (our step runs inside TRL's step-end callback); peak RSS from
     one child each (ours ≤ TRL's).

Batch: 4 pairs of ~64 prompt + 64 chosen + 64 rejected tokens, CPU threads as given, both sides
in the same precision: `--precision fp32` (default, the issue's setting) or `bf16` (autocast
over fp32 weights, TRL's own default, fast on CPUs with AMX).
`--quick` runs the same on tiny-llama in under a minute (the targets apply to SmolLM2).
The last line printed is one JSON object with every figure and its target.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from procfs import status_kb
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
from trl_baseline import trl_dpo_trainer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not getrusage: Linux carries ru_maxrss across execve,
    so a child would report its (larger) parent's peak."""
    return status_kb("VmHWM") / 1024


def make_data(model: str, path: Path, n: int = 64, tokens: int = 64) -> Path:
    """Conversational pairs whose templated prompt and completions are each ~`tokens` long."""
    from trainer.modeling import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(model))
    prompt = text_of(tok, tokens, user_turn(tok))
    answer = text_of(tok, tokens - 2, lambda s: s + (tok.eos_token or ""))
    rows = []
    for i in range(n):
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{i} {prompt}"}],
                "chosen": [{"role": "assistant", "content": f"yes {answer}"}],
                "rejected": [{"role": "assistant", "content": f"no {answer}"}],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --precision, passed to the child processes through the environment: both sides always run
# the same arithmetic (TRL's own default is bf16 autocast, ours is fp32).
PRECISION = os.environ.get("SYNC_BENCH_PRECISION", "fp32")


def make_spec(model: str, data: Path, variant: str, adapter: str, steps: int):
    from contract.spec import JobSpec

    return JobSpec.model_validate(
        {
            "precision": PRECISION,
            "base_model": model,
            "training_file": str(data),
            "objective": "dpo",
            "variant": variant,
            "batch_size": 4,
            "max_steps": steps,
            "max_prompt_length": 72,
            "max_length": 144,
            "quality_sample": 0,
            "adapter": {"kind": "lora", "r": 16, "alpha": 32}
            if adapter == "lora"
            else {"kind": "none"},
        }
    )


# ---- A: interleaved step times ----------------------------------------------------------------
def step_times(model: str, data: Path, adapter: str, steps: int) -> dict:
    import torch

    from trainer.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        off = Trainer(
            make_spec(model, data, "offline", adapter, steps), Path(tmp) / "off", progress=False
        )
        hl = Trainer(
            make_spec(model, data, "offline+humanline", adapter, steps),
            Path(tmp) / "hl",
            progress=False,
        )
        t_off, t_hl, t_sync = [], [], []
        for s, m_off, m_hl in interleaved(off, hl, steps):
            if s > 1:  # step 1 warms caches and allocators
                t_off.append(m_off["step_time"])
                t_hl.append(m_hl["step_time"])
                t_sync.append(m_hl["sync_time"])
        params = [p for p in hl.model.parameters() if p.requires_grad]
        shadow = [p.detach().clone() for p in params]
        t0 = time.perf_counter()
        with torch.no_grad():
            for dst, src in zip(shadow, params, strict=True):
                dst.copy_(src)
        copy_s = time.perf_counter() - t0
    med_off, med_hl = statistics.median(t_off), statistics.median(t_hl)
    return {
        "offline_step_s": med_off,
        "humanline_step_s": med_hl,
        "ratio": med_hl / med_off,
        "sync_s": statistics.median(t_sync),
        "weight_copy_s": copy_s,
        "trainable_params": sum(p.numel() for p in params),
    }


# ---- B / C children: one configuration per process, for honest peak RSS -------------------------
def child_ours(model: str, data: Path, variant: str, adapter: str, steps: int) -> dict:
    from trainer.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(make_spec(model, data, variant, adapter, steps), Path(tmp), progress=False)
        times = [tr.step(s)["step_time"] for s in range(1, steps + 1)]
    return {"peak_rss_mb": peak_rss_mb(), "step_s": statistics.median(times[1:] or times)}


def trl_trainer(model: str, data: Path, steps: int, out: str, callbacks=()):
    from trainer.modeling import resolve_model

    # TRL's default is bf16 autocast; the comparison needs equal precision
    return trl_dpo_trainer(
        resolve_model(model), data, Path(out), batch=4, steps=steps, max_length=144, lr=5e-6,
        cpu=True, bf16=PRECISION == "bf16", callbacks=callbacks,
    )  # fmt: skip


def child_trl(model: str, data: Path, steps: int) -> dict:
    from transformers import TrainerCallback

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as tmp:
        trl_trainer(model, data, steps, tmp, [Timer()]).train()
    return {"peak_rss_mb": peak_rss_mb(), "step_s": statistics.median(times[1:] or times)}


def versus_trl(model: str, data: Path, steps: int) -> dict:
    """TRL's steps and ours interleaved: ours runs inside TRL's step-end callback."""
    from transformers import TrainerCallback

    from trainer.train import Trainer

    t_trl, t_ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ours = Trainer(
            make_spec(model, data, "offline+humanline", "full", steps),
            Path(tmp) / "ours",
            progress=False,
        )

        class Interleave(TrainerCallback):
            def on_step_begin(self, *a, **k):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **k):
                t_trl.append(time.perf_counter() - self.t0)
                t_ours.append(ours.step(state.global_step)["step_time"])

        trl_trainer(model, data, steps, str(Path(tmp) / "trl"), [Interleave()]).train()
    trl_s, ours_s = statistics.median(t_trl[1:]), statistics.median(t_ours[1:])
    return {"trl_step_s": trl_s, "ours_step_s": ours_s, "ratio": ours_s / trl_s}


def main() -> None:
    global PRECISION
    ap = parser(__doc__)
    ap.add_argument(
        "--parts",
        default="interleaved,memory,trl",
        help="comma-separated subset of interleaved (A), memory (B), trl (C)",
    )
    ap.add_argument("--adapters", default="lora,full", help="comma-separated: lora, full")
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default=os.environ.get("SYNC_BENCH_PRECISION", "fp32"),
        help="both sides: fp32, or bf16 autocast over fp32 weights (TRL's default)",
    )
    args = ap.parse_args()
    pin_threads(args.threads)  # the A/B ratios: both sides (and the children) on equal threads
    PRECISION = os.environ["SYNC_BENCH_PRECISION"] = args.precision
    if args.child:
        kind, model, data, *rest = args.child
        if kind == "trl":
            print(json.dumps(child_trl(model, Path(data), int(rest[0]))))
        else:
            print(json.dumps(child_ours(model, Path(data), rest[0], rest[1], int(rest[2]))))
        return

    model, steps = model_and_steps(args, 4, 6)
    tmp = Path(tempfile.mkdtemp())
    data = make_data(model, tmp / "pairs.jsonl")
    result: dict = {
        "model": model,
        "steps": steps,
        "threads": threads(),
        "batch": f"4 pairs x (64 prompt + 64 chosen + 64 rejected) tokens, {PRECISION}",
    }
    parts, targets, met = set(args.parts.split(",")), {}, {}
    for adapter in args.adapters.split(","):
        a: dict = {}
        if "interleaved" in parts:
            a.update(step_times(model, data, adapter, steps))
            targets[f"{adapter}.ratio"], met[f"{adapter}.ratio"] = "<= 1.03", a["ratio"] <= 1.03
        if "memory" in parts:
            mem_off = run_child(__file__, "ours", model, str(data), "offline", adapter, "3")
            mem_hl = run_child(
                __file__, "ours", model, str(data), "offline+humanline", adapter, "3"
            )
            a.update(
                offline_peak_rss_mb=mem_off["peak_rss_mb"],
                humanline_peak_rss_mb=mem_hl["peak_rss_mb"],
                rss_ratio=mem_hl["peak_rss_mb"] / mem_off["peak_rss_mb"],
            )
            limit = 1.02 if adapter == "lora" else 1.0
            targets[f"{adapter}.rss_ratio"], met[f"{adapter}.rss_ratio"] = (
                f"<= {limit}",
                a["rss_ratio"] <= limit,
            )
        result[adapter] = a
        print(f"{adapter}: {json.dumps(a)}", flush=True)
    if "trl" in parts:
        vs = versus_trl(model, data, steps)
        mem_trl = run_child(__file__, "trl", model, str(data), "3")
        mem_ours = run_child(__file__, "ours", model, str(data), "offline+humanline", "full", "3")
        vs.update(
            trl_peak_rss_mb=mem_trl["peak_rss_mb"],
            ours_peak_rss_mb=mem_ours["peak_rss_mb"],
            rss_ratio=mem_ours["peak_rss_mb"] / mem_trl["peak_rss_mb"],
            memory_savers={
                "trl": "gradient checkpointing (TRL default), "
                "fused LM head (log-probs without full logits); keeps a reference model copy",
                "ours": "no reference model (lookahead log-probs), "
                "each pair's prompt run once (shared prefix), "
                "logits only on completion positions; no checkpointing",
            },
        )
        result["vs_trl"] = vs
        targets.update({"vs_trl.ratio": "<= 0.70", "vs_trl.rss_ratio": "<= 1.00"})
        met.update(
            {"vs_trl.ratio": vs["ratio"] <= 0.70, "vs_trl.rss_ratio": vs["rss_ratio"] <= 1.0}
        )
    result["targets"], result["met"] = targets, met
    print(json.dumps(result))


if __name__ == "__main__":
    main()
