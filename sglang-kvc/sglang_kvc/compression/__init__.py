"""KV-cache compression: policies (pure tensor code) and the engine-side pieces.

- `base.py`: `CompressionConfig`, `CompressionPolicy` (score -> kept positions per layer/KV head)
- `scoring.py`: window importance, pooling, key redundancy
- `rkv.py`, `snapkv.py`, `streamingllm.py`: one policy each
- `query_ring.py`: the last w post-RoPE queries per request and layer
- `trigger.py`: when a request compresses, and its KV footprint bound (used by admission)
- `compressor.py`: gathers keys/queries, asks the policy, compacts the KV cache, keeps stats
"""

from .base import CompressionConfig, CompressionPolicy
from .rkv import RKVPolicy
from .snapkv import SnapKVPolicy
from .streamingllm import StreamingLLMPolicy

POLICIES = {"rkv": RKVPolicy, "snapkv": SnapKVPolicy, "streamingllm": StreamingLLMPolicy}


def make_policy(cfg: CompressionConfig) -> CompressionPolicy:
    return POLICIES[cfg.algorithm](cfg)


__all__ = ["CompressionConfig", "CompressionPolicy", "RKVPolicy", "SnapKVPolicy",
           "StreamingLLMPolicy", "POLICIES", "make_policy"]
