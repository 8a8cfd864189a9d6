"""Server arguments: one typed dataclass shared by the CLI, the HTTP server and the in-process engine.

Names follow SGLang's (`--model-path`, `--mem-fraction-static`, ...) so launch scripts written for
SGLang work unchanged for the flags both understand.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _arg(default: Any, help: str, **kw) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServerArgs:
    model_path: str = _arg(None, "HF checkpoint directory (config.json, *.safetensors, tokenizer)")
    tokenizer_path: str | None = _arg(None, "tokenizer directory; defaults to --model-path")
    host: str = _arg("127.0.0.1", "HTTP host to bind")
    port: int = _arg(30000, "HTTP port to bind")
    device: str = _arg("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N")
    dtype: str = _arg("auto", "weight/activation dtype; auto = the checkpoint's dtype",
                      choices=["auto", "float32", "bfloat16", "float16"])
    kv_cache_dtype: str = _arg("auto", "KV pool dtype; auto = --dtype",
                               choices=["auto", "float32", "bfloat16", "float16"])
    mem_fraction_static: float = _arg(
        0.85, "GPU only: fraction of total device memory for weights + KV pool")
    max_total_tokens: int | None = _arg(
        None, "KV pool size in tokens (caps the --mem-fraction-static size; CPU default 16384)")
    max_running_requests: int = _arg(256, "most requests decoding at once")
    max_prefill_tokens: int = _arg(16384, "token budget of one prefill batch")
    context_length: int | None = _arg(
        None, "longest prompt+output per request; default the model's max_position_embeddings")
    page_size: int = _arg(1, "KV tokens per page (only 1 is implemented)")
    random_seed: int = _arg(0, "seed for requests that give no sampling_seed")
    sampling_defaults: str = _arg(
        "model", "where unset temperature/top_p/top_k/min_p come from",
        choices=["model", "openai"])
    skip_tokenizer_init: bool = _arg(False, "no tokenizer: input_ids in, output_ids out")
    attention_backend: str = _arg(
        "auto", "decode attention: torch (gather slots + SDPA) or triton (paged kernel, CUDA)",
        choices=["auto", "torch", "triton"])
    cuda_graph: bool = _arg(True, "capture decode steps in CUDA graphs (CUDA + triton only)",
                            negatable=True)
    cuda_graph_max_bs: int = _arg(256, "largest decode batch captured in a CUDA graph")
    served_model_name: str | None = _arg(None, "model id shown by /v1/models; default the path")
    weight_version: str = _arg("default", "initial weight_version reported in meta_info")
    log_level: str = _arg("info", "uvicorn log level")

    def __post_init__(self) -> None:
        if self.page_size != 1:
            raise ValueError("--page-size: only 1 (token-granular slots) is implemented")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError("--mem-fraction-static must be in (0, 1)")
        for name in ("max_running_requests", "max_prefill_tokens", "cuda_graph_max_bs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError("--max-total-tokens must be >= 2")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            meta = dict(f.metadata)
            help_text = meta.pop("help")
            negatable = meta.pop("negatable", False)
            if f.type in ("bool", bool):
                action = argparse.BooleanOptionalAction if negatable else "store_true"
                parser.add_argument(flag, action=action, default=f.default, help=help_text)
                continue
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
            parser.add_argument(flag, type=kind, default=f.default,
                                required=f.name == "model_path",
                                help=f"{help_text} (default: {f.default})", **meta)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
