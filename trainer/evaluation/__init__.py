"""Evaluation of checkpoints (DESIGN.md §4): AlpacaEval-style pairwise win rates and
MATH500-style pass@1.

    (reports/stats.py: win rate ± SE, length-controlled win rate, pass@1; numpy only)
    judges         pairwise judges: any OpenAI-compatible chat endpoint, or a local reward model
    generation     load a checkpoint (base model, exported dir, training checkpoint) and sample
    instruction    generate → judge in both orders → win rates and per-item records
    math           generate n samples → math-verify → pass@1, format rate, per-item records
    (tools/openai_server.py: a small OpenAI-compatible chat server over a local model, for judges)
    run            `python -m trainer.evaluation run --config cfg.json --out DIR` (the worker)
    probe_rm       a reward model fitted in a second from preference pairs (make demo's judge)
    demo_set       writes examples/data/instruction_eval_demo.jsonl (make demo's eval set)

Importing this package is cheap and torch-free: torch is imported by the modules that need
it (generation, the reward-model judge, the server), so the API and the report code can use
`stats` without pulling in the torch stack.
"""
