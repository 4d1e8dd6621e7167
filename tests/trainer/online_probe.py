"""`python -m tests.trainer.online_probe run SPEC --out DIR`: the trainer's CLI, with every
online chunk's sampled token ids appended to DIR/samples-rank-R.jsonl (one line per chunk:
its prompts' completions, every rank's, as the round gathered them). Lets a test launched
like the worker's (several processes) compare what two jobs sampled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.__main__ import app
from trainer.online import rounds

_real = rounds.OnlineData._sample_and_score


def _recording(self, sampler, chunk, seed, totals, scores):
    groups = _real(self, sampler, chunk, seed, totals, scores)
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"samples-rank-{self.acc.process_index}.jsonl", "a") as f:
        f.write(json.dumps([[list(s.token_ids) for s in g] for g in groups]) + "\n")
    return groups


rounds.OnlineData._sample_and_score = _recording  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(app())
