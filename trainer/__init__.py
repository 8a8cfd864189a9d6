"""Sparse-RL trainer: Megatron-core GRPO on KV-compressed rollouts."""
