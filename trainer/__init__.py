"""Humanline trainer: losses, recipes and checkpoints for DPO/KTO/GRPO and their humanline variants."""
