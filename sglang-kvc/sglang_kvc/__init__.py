"""sglang-kvc: an SGLang-compatible rollout server with KV-cache compression.

The public API, as SGLang's (``import sglang as sgl; sgl.Engine(...)``)::

    import sglang_kvc

    engine = sglang_kvc.Engine(model_path="Qwen/Qwen2.5-0.5B-Instruct", compress_algorithm="rkv")
    out = engine.generate(prompt="1 + 1 =", sampling_params={"max_new_tokens": 8})

Callers outside this package (the trainer, recipes, benchmarks) import from here, never from a
submodule: the engine's layout can then change without them. Names resolve on first use, so
``import sglang_kvc`` stays cheap (no torch) for the CPU-only paths that only need a flag list.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute there)
_EXPORTS = {
    # the engine and its one config
    "Engine": ("sglang_kvc.engine.engine", "Engine"),
    "ServerArgs": ("sglang_kvc.server_args", "ServerArgs"),
    "create_app": ("sglang_kvc.server.app", "create_app"),  # the HTTP server around an Engine
    # argparse with one-line errors and no abbreviated flags: launch_server's, and the trainer's
    "OneLineParser": ("sglang_kvc.server_args", "OneLineParser"),
    # KV compression: the policy registry and the per-sample eviction record
    "POLICIES": ("sglang_kvc.compression", "POLICIES"),
    "CompressionConfig": ("sglang_kvc.compression", "CompressionConfig"),
    "decode_eviction_record": ("sglang_kvc.compression.eviction_record", "decode"),
    "encode_eviction_record": ("sglang_kvc.compression.eviction_record", "encode"),
    # weight updates: the payloads the update endpoints / Engine.update_weights_* take
    "serialize_named_tensors": ("sglang_kvc.weights.transport", "serialize_named_tensors"),
    "serialize_ipc_bucket": ("sglang_kvc.weights.transport", "serialize_ipc_bucket"),
    "flatten_bucket": ("sglang_kvc.weights.transport", "flatten"),
    "bucket_specs": ("sglang_kvc.weights.transport", "specs"),
    "create_weight_update_group": ("sglang_kvc.weights.transport", "create_weight_update_group"),
    # the trainer's side of the group's rendezvous, on a port it already listens on
    "weight_update_master_store": ("sglang_kvc.weights.transport", "master_store"),
    # whether the engine's SDPA calls may use cuDNN attention (default off: its per-shape plans)
    "set_cudnn_sdp": ("sglang_kvc.layers.attention", "set_cudnn_sdp"),
    "cudnn_sdp_allowed": ("sglang_kvc.layers.attention", "cudnn_sdp_allowed"),
    # another thread's GPU work vs the engine thread's CUDA-graph captures
    "device_work": ("sglang_kvc.engine.cuda_graph", "device_work"),
    # tool calls in a model's text: the server's --tool-call-parser and the trainer's --tool-parser
    "ToolCall": ("sglang_kvc.function_call", "ToolCall"),
    "TOOL_CALL_PARSERS": ("sglang_kvc.function_call", "PARSERS"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sglang_kvc' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
