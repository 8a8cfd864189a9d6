"""sglang-kvc: an SGLang-compatible rollout server with KV-cache compression."""

__version__ = "0.1.0"
