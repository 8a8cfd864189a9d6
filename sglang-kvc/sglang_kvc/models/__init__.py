"""The decoder model (Llama / Qwen2 / Qwen3 families) and its config."""
