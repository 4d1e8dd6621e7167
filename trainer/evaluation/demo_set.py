"""The demo's instruction-following eval set, generated here (nothing downloaded):

    python -m trainer.evaluation.demo_set [--out examples/data/instruction_eval_demo.jsonl]

AlpacaEval's layout `{"instruction", "output", "generator"}`. The instructions are held-out
prompts of the demo's preference data (trainer.synthetic.eval_prompts: arithmetic pairs and
instruction topics that no bundled preference file contains). The reference `output` is the
*base* model's own greedy answer, cut at MAX_NEW_TOKENS as the demo cuts the fine-tuned
models' answers, so a win rate reads "how often the judge prefers the fine-tuned model's answer
to the model it started from" (0.5 = no change the judge can see).

Greedy float32 decoding on CPU: the file is reproducible with the locked versions; it is
committed, so the demo never has to regenerate it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainer.synthetic import eval_prompts

BASE_MODEL = "smollm2-135m-instruct"
ITEMS = 32
MAX_NEW_TOKENS = 32
SEED = 11
REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "examples" / "data" / "instruction_eval_demo.jsonl"
TRAINING_FILES = ("preferences_small.jsonl", "preferences.jsonl")


def held_out_prompts(n: int = ITEMS, seed: int = SEED) -> list[str]:
    seen = set()
    for name in TRAINING_FILES:
        for line in (REPO / "examples" / "data" / name).read_text().splitlines():
            if line.strip():
                prompt = json.loads(line)["prompt"]
                seen.add(prompt if isinstance(prompt, str) else json.dumps(prompt))
    return eval_prompts(n, seed, exclude=frozenset(seen))


def records(n: int = ITEMS, seed: int = SEED) -> list[dict[str, str]]:
    from trainer.evaluation.generation import Generator

    prompts = held_out_prompts(n, seed)
    generator = Generator.from_source({"type": "base", "name": BASE_MODEL}, device="cpu")
    answers = generator.generate(
        [[{"role": "user", "content": p}] for p in prompts], max_new_tokens=MAX_NEW_TOKENS
    )
    return [
        {"instruction": p, "output": a[0].text, "generator": f"{BASE_MODEL} (greedy)"}
        for p, a in zip(prompts, answers, strict=True)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--items", type=int, default=ITEMS)
    args = parser.parse_args(argv)
    rows = records(args.items)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(args.out)


if __name__ == "__main__":
    main()
