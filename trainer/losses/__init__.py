"""Loss modules: one objective per module, humanline applied once in ``humanline.py``.

All inputs are per-token log-probs [B, T] over completion tokens plus a mask [B, T] (1 on
completion tokens); whatever sits under mask 0 never reaches the loss or its gradient.
"""

from trainer.losses.dpo import dpo_loss
from trainer.losses.grpo import group_advantages, grpo_loss
from trainer.losses.humanline import sequence_rewards, token_log_ratios
from trainer.losses.kto import kto_loss
from trainer.losses.sft import sft_loss
from trainer.losses.types import LossOutput

__all__ = [
    "LossOutput",
    "dpo_loss",
    "group_advantages",
    "grpo_loss",
    "kto_loss",
    "sequence_rewards",
    "sft_loss",
    "token_log_ratios",
]
