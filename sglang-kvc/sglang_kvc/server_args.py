"""Server arguments: one typed dataclass shared by the CLI, the HTTP server and the in-process engine.

Names follow SGLang's (`--model-path`, `--mem-fraction-static`, ...) so launch scripts written for
SGLang work unchanged for the flags both understand.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .compression import POLICY_NAMES
from .function_call import FORMATS as TOOL_CALL_FORMATS

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e5m2", "fp8_e4m3")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (the usage of ~40 flags buried the message), and which
    never expands an abbreviated flag (`--max-stalenes` must not silently mean another)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def check_model_dir(path: str, flag: str = "--model-path") -> str | None:
    """Why `path` is not a local HF checkpoint, or None. Checked before transformers sees it: a
    missing path would otherwise be taken for a hub repo id (a traceback, or minutes of
    retrying a network this machine may not have)."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        return f"{flag} {path}: no such directory (a local checkpoint with config.json; " \
               f"./scripts/get-smollm2.sh fetches one)"
    if not (p / "config.json").is_file():
        return f"{flag} {path}: no config.json there"
    return None


def parse_batch_sizes(spec: str) -> list[int]:
    """``--cuda-graph-bs``: comma-separated sizes and ranges, ``"1-8,12,16"`` -> [1, ..., 8, 12,
    16] (sorted, each once); ValueError for anything else."""
    sizes = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"--cuda-graph-bs: {part.strip()!r} is not a size or a range a-b") from None
        if a < 1 or b < a:
            raise ValueError(f"--cuda-graph-bs: {part.strip()!r}: sizes are >= 1, ranges low-high")
        sizes.update(range(a, b + 1))
    return sorted(sizes)


def _arg(default: Any, help: str, **kw) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServerArgs:
    model_path: str = _arg(None, "HF checkpoint directory (config.json, *.safetensors, tokenizer)")
    tokenizer_path: str | None = _arg(None, "tokenizer directory; defaults to --model-path")
    host: str = _arg("127.0.0.1", "HTTP host to bind")
    port: int = _arg(30000, "HTTP port to bind")
    api_key: str | None = _arg(
        None, "as SGLang's: every route but /health needs the header 'Authorization: Bearer "
              "KEY' (else HTTP 401); without it, bind only 127.0.0.1")
    device: str = _arg("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N")
    dtype: str = _arg("auto", "weight/activation dtype; auto = the checkpoint's dtype",
                      choices=["auto", "float32", "bfloat16", "float16"])
    kv_cache_dtype: str = _arg(
        "auto", "KV pool dtype; auto = --dtype. fp8_e5m2 / fp8_e4m3 (SGLang's names) store K/V "
        "in FP8 (1 byte: twice the slots of bf16) with per-layer scales (1.0, or "
        "--quantization-param-path); decode reads them dequantized (docs/engine.md, FP8 KV)",
        choices=list(KV_CACHE_DTYPES))
    quantization_param_path: str | None = _arg(
        None, "JSON of per-layer FP8 KV scales (SGLang's kv_cache.scaling_factor form); "
              "default 1.0 for every layer; only with --kv-cache-dtype fp8_*")
    mem_fraction_static: float = _arg(
        0.85, "GPU only: fraction of total device memory for weights + KV pool")
    max_total_tokens: int | None = _arg(
        None, "KV pool size in tokens (caps the --mem-fraction-static size; CPU default 16384)")
    max_running_requests: int = _arg(256, "most requests decoding at once")
    # Admission control (engine/admission.py). 128 = OpenAI's own cap on n; GRPO groups are 4-64.
    max_n: int = _arg(128, "most samples one prompt may ask for (n); above: HTTP 400")
    max_queued_requests: int = _arg(
        16384, "most samples queued or running at once (a request's n samples count n); beyond: "
               "HTTP 503, retry later")
    max_queued_tokens: int | None = _arg(
        None, "most tokens (prompt + max_new_tokens per sample) queued or running at once; "
              "beyond: HTTP 503; default 64 x the KV pool")
    max_prefill_tokens: int = _arg(16384, "token budget of one prefill batch")
    schedule_prefill_delay_steps: int = _arg(
        0, "decode steps a small prefill waits for more arrivals while other requests decode "
           "(0: at once). Multi-turn rollouts, whose turns arrive a few at a time, batch their "
           "continuations: each eager prefill step costs tens of ms of host (docs/engine.md)")
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
    disable_radix_cache: bool = _arg(
        False, "no prefix sharing: every request computes and holds its whole prompt (default: "
               "prompts' KV is cached and shared, docs/engine.md 'Prefix sharing')")
    disable_overlap_schedule: bool = _arg(
        False, "read each step's tokens before launching the next (default: prepare step N+1 "
               "while the GPU runs step N)")
    kv_stable_address: bool = _arg(
        True, "keep the KV pool at one address across release/resume_memory_occupation (CUDA "
              "virtual memory: the memory is given back, the address kept), so decode graphs are "
              "captured once per engine life, not once per colocated rollout", negatable=True)
    cuda_graph_max_bs: int = _arg(256, "largest decode batch captured in a CUDA graph")
    cuda_graph_bs: str | None = _arg(
        None, "decode batch sizes with a CUDA graph, e.g. 1-32,48,64 (a batch runs in the "
              "smallest one that holds it); default every size to 8, 12, 16, 24, 32, then every "
              "16, up to --cuda-graph-max-bs")
    prefill_graph_max_tokens: int = _arg(
        8192, "largest prefill captured in a CUDA graph when every request in it holds KV (a "
              "session's next turn, a prompt whose head is cached; CUDA + triton, with "
              "--cuda-graph); one graph per padded token count, up to this; 0: none")
    served_model_name: str | None = _arg(None, "model id shown by /v1/models; default the path")
    tool_call_parser: str | None = _arg(
        None, "as SGLang's: the format the model writes tool calls in, read back into "
              "/v1/chat/completions' tool_calls: qwen25 (Qwen2.5, Qwen3: <tool_call>{json}"
              "</tool_call>), hermes (the same tags), llama3 (Llama 3.x: a JSON object, "
              "optionally after <|python_tag|>); unset: calls stay text in content",
        choices=list(TOOL_CALL_FORMATS))
    weight_version: str = _arg("default", "initial weight_version reported in meta_info")
    log_level: str = _arg("info", "uvicorn log level")

    # KV-cache compression (reference sglang-kvc names; docs/engine.md "Compression").
    compress_algorithm: str | None = _arg(
        None, f"{', '.join(POLICY_NAMES)} (case-insensitive; RKV accepted); unset = dense KV")
    compress_max_prompt: int = _arg(
        512, "KV token budget B: a request is compressed back to B tokens, and only once it "
             "holds more than B")
    compress_max_window: int = _arg(
        8, "observation window: queries cached per layer for scoring; the newest tokens always kept")
    compress_divide_method: str = _arg(
        "step_length", "when to compress during decode: step_length (once B + "
        "--compress-divide-length tokens are held) or newline (after a newline-like token; "
        "also at B + divide length, so memory stays bounded)", choices=["step_length", "newline"])
    compress_divide_length: int = _arg(
        128, "buffer N: compress back to B once B + N tokens are held")
    compress_mix_lambda: float = _arg(
        0.1, "rkv: score = lambda * importance - (1 - lambda) * redundancy")
    compress_kernel_size: int = _arg(7, "rkv/snapkv: 1-D pooling kernel over importance (odd)")
    compress_pooling: str = _arg("max", "rkv/snapkv: pooling kind", choices=["max", "avg"])
    compress_sim_threshold: float = _arg(
        0.5, "rkv: key cosine similarity above which tokens count as near-duplicates")
    compress_num_sink: int = _arg(4, "streamingllm: attention-sink tokens always kept")
    compress_prompt: bool = _arg(
        False, "also compress right after prefill when the prompt exceeds B (the reference "
               "never compresses prefill)", negatable=True)
    compress_keep_prompt: bool = _arg(
        False, "never evict the prompt's KV: only response tokens are scored and evicted, the "
               "budget B and buffer N count response tokens, so a request holds at most its "
               "prompt + B + N slots (incompatible with --compress-prompt)", negatable=True)
    compress_pin_turns: bool = _arg(
        False, "with --compress-keep-prompt, for a session's request (a multi-turn sample) pin "
               "every turn's prompt, not only the chain's first: what the row holds after the "
               "turn's prefill (the earlier turns' KV as adopted, compressed or not, plus the "
               "new tokens, e.g. tool responses) is never evicted, and compression within a "
               "turn evicts only that turn's generated tokens. Pool cost: each turn keeps up to "
               "B + N of its generated tokens for good, so a chain of T turns holds up to its "
               "prompts and observations + T x (B + N) slots, against first prompt + B + N "
               "without it", negatable=True)
    compress_stop_after_think: bool = _arg(
        True, "stop compressing a request once it generated </think> (when the tokenizer has it)",
        negatable=True)
    compress_selection: str = _arg(
        "head", "kept-token sets per layer and KV head (head, the original R-KV) or per layer "
        "(layer: scores summed over KV heads)", choices=["head", "layer"])
    compress_shared_selection: bool = _arg(
        False, "reproduce the reference server: one kept set per request, from layer 0's "
               "head-summed scores, for every layer and head")

    def __post_init__(self) -> None:
        if self.page_size != 1:
            raise ValueError("--page-size: only 1 (token-granular slots) is implemented")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError("--mem-fraction-static must be in (0, 1)")
        for name in ("max_running_requests", "max_prefill_tokens", "cuda_graph_max_bs", "max_n",
                     "max_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.cuda_graph_bs is not None:
            parse_batch_sizes(self.cuda_graph_bs)
        for name in ("schedule_prefill_delay_steps", "prefill_graph_max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if self.max_queued_tokens is not None and self.max_queued_tokens < 1:
            raise ValueError("--max-queued-tokens must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError("--max-total-tokens must be >= 2")
        if self.tool_call_parser not in (None, *TOOL_CALL_FORMATS):
            raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_FORMATS)} "
                             f"(got {self.tool_call_parser!r})")
        self._validate_kv_dtype()
        self._validate_compression()

    def _validate_kv_dtype(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)} "
                             f"(got {self.kv_cache_dtype!r})")
        if self.quantization_param_path is not None and not self.kv_cache_dtype.startswith("fp8"):
            raise ValueError("--quantization-param-path gives FP8 KV scales: it needs "
                             "--kv-cache-dtype fp8_e5m2 or fp8_e4m3")

    def _validate_compression(self) -> None:
        """Every --compress-* value is checked here, even when compression is off, so a typo
        fails at startup rather than when someone later turns compression on."""
        algo = self.compress_algorithm
        if isinstance(algo, str):
            algo = algo.strip().lower()
            self.compress_algorithm = None if algo in ("", "none") else algo
        if self.compress_algorithm not in (None, *POLICY_NAMES):
            raise ValueError(f"--compress-algorithm must be one of {', '.join(POLICY_NAMES)} "
                             f"(got {algo!r})")
        for name in ("compress_max_prompt", "compress_max_window", "compress_divide_length",
                     "compress_kernel_size", "compress_num_sink"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer (got {v!r})")
        if self.compress_max_window < 1:
            raise ValueError("--compress-max-window must be >= 1")
        if self.compress_max_prompt <= self.compress_max_window:
            raise ValueError(f"--compress-max-prompt ({self.compress_max_prompt}) must be larger "
                             f"than --compress-max-window ({self.compress_max_window})")
        if self.compress_divide_length < 1:
            raise ValueError("--compress-divide-length must be >= 1")
        if self.compress_divide_method not in ("step_length", "newline"):
            raise ValueError(f"--compress-divide-method must be step_length or newline "
                             f"(got {self.compress_divide_method!r})")
        if not 0.0 <= float(self.compress_mix_lambda) <= 1.0:
            raise ValueError("--compress-mix-lambda must be in [0, 1]")
        if self.compress_kernel_size < 1 or self.compress_kernel_size % 2 == 0:
            raise ValueError("--compress-kernel-size must be a positive odd number (the pooled "
                             "scores keep their length)")
        if self.compress_pooling not in ("max", "avg"):
            raise ValueError(f"--compress-pooling must be max or avg (got {self.compress_pooling!r})")
        if not -1.0 <= float(self.compress_sim_threshold) <= 1.0:
            raise ValueError("--compress-sim-threshold must be in [-1, 1] (a cosine similarity)")
        if self.compress_num_sink < 0:
            raise ValueError("--compress-num-sink must be >= 0")
        if (self.compress_algorithm == "streamingllm"
                and self.compress_num_sink > self.compress_max_prompt - self.compress_max_window):
            raise ValueError("--compress-num-sink must be <= --compress-max-prompt - "
                             "--compress-max-window")
        if self.compress_selection not in ("head", "layer"):
            raise ValueError(f"--compress-selection must be head or layer "
                             f"(got {self.compress_selection!r})")
        if self.compress_keep_prompt and self.compress_prompt:
            raise ValueError("--compress-keep-prompt never evicts the prompt and "
                             "--compress-prompt compresses it: pick one")
        if self.compress_pin_turns and not self.compress_keep_prompt:
            raise ValueError("--compress-pin-turns extends --compress-keep-prompt to every "
                             "turn of a session: add --compress-keep-prompt")

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
        """The args as /get_server_info shows them: the API key is never echoed."""
        d = dataclasses.asdict(self)
        d["api_key"] = None if self.api_key is None else "<set>"
        return d
