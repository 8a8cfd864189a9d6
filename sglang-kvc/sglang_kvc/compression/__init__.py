"""KV-cache compression: policies (pure tensor code) and the engine-side pieces.

- `base.py`: `CompressionConfig`, `CompressionPolicy` (score -> kept positions per layer/KV head)
- `scoring.py`: window importance, pooling, key redundancy
- `rkv.py`, `snapkv.py`, `streamingllm.py`: one policy each
- `query_ring.py`: the last w post-RoPE queries per request and layer
- `trigger.py`: when a request compresses, and its KV footprint bound (used by admission)
- `compressor.py`: gathers keys/queries, asks the policy, compacts the KV cache, keeps stats

Names load on first use, as ``sglang_kvc``'s: the policies are torch code, and the flags
(``server_args.py``) need only their names (``POLICY_NAMES``), so ``--help`` stays fast.
"""

from __future__ import annotations

import importlib

# the policies: --compress-algorithm's name -> (module, class)
_POLICY_CLASSES = {"rkv": ("rkv", "RKVPolicy"), "snapkv": ("snapkv", "SnapKVPolicy"),
                   "streamingllm": ("streamingllm", "StreamingLLMPolicy")}
POLICY_NAMES = tuple(_POLICY_CLASSES)
# public name -> its module here
_EXPORTS = {"CompressionConfig": "base", "CompressionPolicy": "base",
            **{cls: module for module, cls in _POLICY_CLASSES.values()}}


def _load(module: str, attr: str):
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


def __getattr__(name: str):
    if name == "POLICIES":  # name -> policy class
        value = {policy: _load(*where) for policy, where in _POLICY_CLASSES.items()}
    elif name in _EXPORTS:
        value = _load(_EXPORTS[name], name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def make_policy(cfg):
    """The policy ``cfg.algorithm`` names, configured by ``cfg`` (a ``CompressionConfig``)."""
    return _load(*_POLICY_CLASSES[cfg.algorithm])(cfg)


__all__ = ["CompressionConfig", "CompressionPolicy", "RKVPolicy", "SnapKVPolicy",
           "StreamingLLMPolicy", "POLICIES", "POLICY_NAMES", "make_policy"]
