"""The request fields of /v1/completions and /v1/chat/completions, and what becomes of each.

Every field of SGLang's `CompletionRequest` / `ChatCompletionRequest` and of the official OpenAI
client is known here, in one of four tables:

- `SAMPLING`: OpenAI name -> native sampling parameter, validated by the shared SamplingParams;
- `ROUTE_FIELDS`: read by the route itself (prompt, messages, logprobs, tools, stream_options ...);
- `IGNORED`: fields that label, route, cache or bill a request. They cannot change a
  single-model server's answer, so they are accepted with their type checked;
- `NEUTRAL`: fields that would change the answer and that this server does not implement. Their
  neutral values (what LangChain-style clients always send: `tools=[]`,
  `response_format={"type": "text"}`, penalties 0) are accepted and dropped; any other value is
  a 400 that says why, because a rollout sampled from another distribution than the one asked
  for would train on wrong log-probs.

A field in none of them is a 400 too (a mistyped `temprature` must not pass silently).
"""

from __future__ import annotations

from typing import Any

SAMPLING = {
    "max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "n": "n", "stop": "stop", "seed": "sampling_seed", "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens", "stop_token_ids": "stop_token_ids",
    "no_stop_trim": "no_stop_trim", "min_tokens": "min_new_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens", "logit_bias": "logit_bias",
}

_COMMON_ROUTE = {"model", "stream", "stream_options", "logprobs", "rid", "best_of"}
ROUTE_FIELDS = {
    "completions": _COMMON_ROUTE | {"prompt", "echo"},
    "chat": _COMMON_ROUTE | {"messages", "top_logprobs", "chat_template_kwargs", "tools",
                             "tool_choice", "parallel_tool_calls", "reasoning_effort", "reasoning",
                             "input_ids"},
}

_TEXT = (str, list)
IGNORED: dict[str, tuple[type, ...]] = {
    # OpenAI's: who asks, caching and storage hints, output tiers of OpenAI's own models
    "user": (str,), "metadata": (dict,), "store": (bool,), "service_tier": (str,),
    "safety_identifier": (str,), "prompt_cache_key": (str,),
    "prompt_cache_retention": (str,), "prompt_cache_options": (dict,), "verbosity": (str,),
    # SGLang's and sglang-router's: reasoning-parser switches (no parser here), routing, labels
    "separate_reasoning": (bool,), "stream_reasoning": (bool,), "session_id": (str,),
    "extra_key": _TEXT, "cache_salt": _TEXT, "ngram_corpus_id": _TEXT, "priority": (int,),
    "custom_labels": (dict,), "custom_params": (dict,), "bootstrap_host": _TEXT,
    "bootstrap_port": (int, list), "bootstrap_room": (int, list), "routed_dp_rank": (int,),
    "disagg_prefill_dp_rank": (int,), "data_parallel_rank": (int,),
}

_PENALTY = ("penalties are not implemented (the samples and their log-probs would not be the ones "
            "asked for)")
_GRAMMAR = "constrained decoding (grammars, JSON schemas, regexes) is not implemented"
_NOT_HERE = "this server has no such feature"
# name -> (its neutral values, why any other value is refused)
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "frequency_penalty": ((0,), _PENALTY), "presence_penalty": ((0,), _PENALTY),
    "repetition_penalty": ((1,), _PENALTY),
    "response_format": (({"type": "text"},), _GRAMMAR),
    "regex": ((), _GRAMMAR), "ebnf": ((), _GRAMMAR), "json_schema": ((), _GRAMMAR),
    "stop_regex": ((), "stop_regex is not implemented (stop takes strings)"),
    "functions": (([],), "the legacy functions API is not implemented (tools=[...] is "
                         "accepted)"),
    "function_call": (("none", "auto"), "the legacy functions API is not implemented"),
    "suffix": (("",), "suffix (fill-in-the-middle) is not implemented"),
    "modalities": ((["text"],), "only text output is served"),
    "audio": ((), "only text output is served"), "prediction": ((), _NOT_HERE),
    "web_search_options": ((), _NOT_HERE), "task": ((), _NOT_HERE),
    "continue_final_message": ((False,), _NOT_HERE), "lora_path": ((), "no LoRA adapters"),
    "session_params": ((), _NOT_HERE), "custom_logit_processor": ((), _NOT_HERE),
    "return_hidden_states": ((False,), _NOT_HERE), "return_routed_experts": ((False,), _NOT_HERE),
    "routed_experts_start_len": ((0,), _NOT_HERE),
    "return_cached_tokens_details": ((False,), "no prefix cache"),
    "return_prompt_token_ids": ((False,), _NOT_HERE), "return_token_ids": ((False,), _NOT_HERE),
    "return_meta_info": ((False,), _NOT_HERE), "images_config": ((), "text-only models"),
    "max_dynamic_patch": ((), "text-only models"), "min_dynamic_patch": ((), "text-only models"),
    "use_audio_in_video": ((False,), "text-only models"),
}


class OpenAIError(ValueError):
    """A request the OpenAI routes refuse: HTTP `status` in OpenAI's error shape."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def check_fields(body: dict, route: str) -> None:
    """400 for an unknown field, an ignored one of the wrong type or a non-neutral one."""
    known = set(SAMPLING) | ROUTE_FIELDS[route] | set(IGNORED) | set(NEUTRAL)
    unknown = sorted(set(body) - known)
    if unknown:
        raise OpenAIError(f"unknown request field(s): {', '.join(unknown)}")
    for name, types in IGNORED.items():
        _check_type(name, body.get(name), types)
    for name, (neutral, why) in NEUTRAL.items():
        if not is_neutral(body.get(name), neutral):
            raise OpenAIError(f"{name}={body[name]!r} is not supported by this server: {why}; "
                             f"send {_neutral_text(neutral)} or leave it out")
    stream_options(body)


def is_neutral(value: Any, neutral: tuple) -> bool:
    if value is None:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool) and neutral:
        return any(value == v for v in neutral if isinstance(v, (int, float)))
    return any(type(value) is type(v) and value == v for v in neutral)


def _neutral_text(neutral: tuple) -> str:
    import json

    return " or ".join(["null", *(json.dumps(v) for v in neutral)])


def _check_type(name: str, value: Any, types: tuple[type, ...]) -> None:
    if value is None:
        return
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise OpenAIError(f"{name} must be {' or '.join(t.__name__ for t in types)}, "
                         f"got {type(value).__name__}")


def sampling(body: dict, default_max: int | None) -> dict:
    """The native sampling parameters of an OpenAI body (validated later, by SamplingParams)."""
    best_of = body.get("best_of")
    if best_of is not None and best_of != (body.get("n") or 1):
        raise OpenAIError(f"best_of={best_of!r} is not supported by this server: only best_of = n "
                         f"(every sample is returned)")
    sp = {native: body[k] for k, native in SAMPLING.items() if body.get(k) is not None}
    if "max_new_tokens" not in sp and default_max is not None:
        sp["max_new_tokens"] = default_max
    return sp


def stream_options(body: dict) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of `stream_options` (SGLang's StreamOptions)."""
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise OpenAIError("stream_options must be an object with include_usage and/or "
                         "continuous_usage_stats")
    flags = tuple(opts.get(k) or False for k in ("include_usage", "continuous_usage_stats"))
    if not all(isinstance(f, bool) for f in flags):
        raise OpenAIError("stream_options.include_usage and .continuous_usage_stats are booleans")
    if any(flags) and not body.get("stream"):
        raise OpenAIError("stream_options is only allowed when stream is true")
    return flags


_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def template_kwargs(body: dict, tools: list | None) -> dict:
    """What the chat template gets besides the messages, as SGLang builds it: the client's
    `chat_template_kwargs`, the tools (openai_tools.py: none with tool_choice none), and
    `reasoning_effort` (or `reasoning.effort`) as the thinking switches templates read."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise OpenAIError("chat_template_kwargs must be an object")
    kwargs = dict(kwargs)
    if tools:
        kwargs["tools"] = tools
    effort = _effort(body)
    if effort is not None:  # "thinking": DeepSeek, Kimi; "enable_thinking": Qwen3, GLM
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def _effort(body: dict):
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise OpenAIError("reasoning must be an object")
        effort = reasoning.get("effort", effort)
    ok = effort in _EFFORTS or (isinstance(effort, (int, float)) and not isinstance(effort, bool)
                                and 0.0 <= effort <= 0.99)
    if effort is not None and not ok:
        raise OpenAIError(f"reasoning_effort must be one of {', '.join(_EFFORTS)} or a number in "
                          f"[0, 0.99], got {effort!r}")
    return effort


def request_id(body: dict) -> dict:
    """`rid` as the native request id (so /abort_request finds it), when it is one string."""
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise OpenAIError("rid must be a string")
    return {} if rid is None else {"rid": rid}
