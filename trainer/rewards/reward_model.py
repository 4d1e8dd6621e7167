"""``reward_model``: score (prompt, completion) with a local HF sequence-classification model.

The paper's instruction-following runs score with ArmoRM; any checkpoint directory that
``AutoModelForSequenceClassification`` loads with a single output (``num_labels == 1``) works.
Only local directories are accepted: workers never reach the hub. The conversation is rendered
with the reward model's *own* chat template (it was trained on that layout, not the policy's).
torch/transformers are imported when a model is built, so the registry stays importable by the
torch-free API.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class RewardModel:
    def __init__(
        self, path: str, batch_size: int = 8, max_length: int = 2048, device: str = "auto"
    ):
        import torch
        from transformers import AutoModelForSequenceClassification

        from trainer.modeling import load_tokenizer
        from trainer.sampling.types import as_messages

        model_dir = Path(path).expanduser()
        if not (model_dir / "config.json").is_file():
            raise ValueError(
                f"reward_model path {path!r} is not a local model directory with config.json "
                "(hub ids are not downloaded)"
            )
        if batch_size < 1 or max_length < 2:
            raise ValueError("batch_size must be >= 1 and max_length >= 2")
        self._as_messages = as_messages
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        )
        self.tokenizer = load_tokenizer(model_dir)  # pad token, right padding, a template
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
        if model.config.num_labels != 1:
            raise ValueError(
                f"reward_model must have one output (num_labels=1), "
                f"{path!r} has {model.config.num_labels}"
            )
        if model.config.pad_token_id is None:  # batching needs it to find each row's last token
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(self.device).eval()

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        import torch

        texts = [
            self.tokenizer.apply_chat_template(
                self._as_messages(p) + [{"role": "assistant", "content": c}], tokenize=False
            )
            for p, c in zip(prompts, completions, strict=False)
        ]
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    add_special_tokens=False,
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(**batch).logits
                scores.extend(logits[:, 0].float().cpu().tolist())
        return scores

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
