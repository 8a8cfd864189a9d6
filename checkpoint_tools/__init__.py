"""Move weights between Hugging Face safetensors and Megatron-core torch_dist checkpoints."""
