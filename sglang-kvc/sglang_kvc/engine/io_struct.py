"""`/generate` request parsing and response building (SGLang's JSON shapes, engine.md §4).

The HTTP server and the in-process `Engine.generate` go through the same parser, so both reject
the same bad inputs with the same messages (ValueError -> HTTP 400).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from .sampling_params import SamplingParams

log = logging.getLogger(__name__)

GENERATE_KEYS = {
    "text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs", "stream", "token_ids_logprob",
    "compress",  # ours: false = this request keeps its whole KV on a compressing server
    "compress_budget",  # ours: this request's budget B instead of --compress-max-prompt
    "return_eviction_record",  # ours: per layer/KV head, the first query that lost each key
    "session_params",  # SGLang's: continue a request of an open session (sessions.py)
}
# SGLang fields that would change the result, accepted at their default (what every stock client
# sends) and refused otherwise: a value we would silently ignore is a wrong answer.
_NEUTRAL_KEYS = {
    "input_embeds": None, "image_data": None, "video_data": None, "audio_data": None,
    "lora_path": None, "custom_logit_processor": None, "return_hidden_states": False,
    "return_routed_experts": False, "modalities": None,
    "return_entropy": False, "return_sampling_mask": False, "return_flat_raw_top_logprobs": False,
    "return_flat_raw_top_logprobs_b64": False, "return_prompt_token_ids": False,
    "return_indexer_topk": False, "routed_experts_start_len": 0, "mm_hashes": None,
    "mm_content_hashes": None, "use_audio_in_video": False, "video_config": None,
    "positional_embed_overrides": None, "require_reasoning": False, "max_thinking_tokens": None,
    "multi_item_delimiter_indices": None, "images_config": None, "max_dynamic_patch": None,
    "min_dynamic_patch": None, "image_max_dynamic_patch": None, "video_max_dynamic_patch": None,
}
# Fields that only route, label, prioritise or log a request (SGLang's, and what sglang-router
# adds when forwarding): they cannot change a single-model server's answer, so they are accepted
# with their type checked and otherwise ignored. Value: the allowed types (None always is).
_IGNORED_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str,), "background": (bool,), "no_logs": (bool,), "return_bytes": (bool,),
    "log_metrics": (bool,), "session_id": (str,), "conversation_id": (str,), "routing_key": (str,),
    "priority": (int,), "extra_key": (str, list), "custom_labels": (dict,),
    "external_trace_header": (dict,), "received_time": (int, float), "data_parallel_rank": (int,),
    "routed_dp_rank": (int,), "disagg_prefill_dp_rank": (int,), "bootstrap_host": (str, list),
    "bootstrap_port": (int, list), "bootstrap_room": (int, list), "bootstrap_pair_key": (str, list),
    "decode_tp_size": (int, list), "http_worker_ipc": (str,), "lora_id": (str, list),
    "kv_router_hint": (dict,), "cache_salt": (str, list), "need_wait_for_mm_inputs": (bool,),
    "num_items_assigned": (dict,), "encoder_urls": (list,),
}
_logged_ignored: set[str] = set()


def _check_extra_fields(body: dict) -> None:
    known = GENERATE_KEYS | set(_NEUTRAL_KEYS) | set(_IGNORED_KEYS)
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"unknown request field(s): {', '.join(unknown)}")
    for k, neutral in _NEUTRAL_KEYS.items():
        if k in body and body[k] not in (neutral, None):
            raise ValueError(f"{k}={body[k]!r} is not supported by this server")
    for k, types in _IGNORED_KEYS.items():
        value = body.get(k)
        if value is not None and (not isinstance(value, types) or
                                  (isinstance(value, bool) and bool not in types)):
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{k} must be {names}, got {type(value).__name__}")
    _log_ignored(sorted(k for k in body if k in _IGNORED_KEYS and k not in _logged_ignored))


def _log_ignored(names: list[str]) -> None:
    if names:
        _logged_ignored.update(names)
        log.info("accepting and ignoring request field(s) %s: they route or label a request and "
                 "do not change this server's output (logged once per field)", ", ".join(names))


@dataclass(frozen=True)
class SessionParams:
    """SGLang's `session_params`: continue request `rid` of session `id` (None: the session's
    first request). Only appending at the end of that request's context is supported."""
    id: str
    rid: str | None = None

    @classmethod
    def parse(cls, value: Any) -> "SessionParams | None":
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError("session_params must be an object {\"id\": ..., \"rid\": ...}")
        unknown = sorted(set(value) - {"id", "rid", "offset", "replace", "drop_previous_output"})
        if unknown:
            raise ValueError(f"unknown session_params field(s): {', '.join(unknown)}")
        for key in ("offset", "replace", "drop_previous_output"):
            if value.get(key) not in (None, 0, False):
                raise ValueError(f"session_params.{key}={value[key]!r} is not supported: a "
                                 f"session request appends to the end of request rid's context")
        sid, rid = value.get("id"), value.get("rid")
        if not isinstance(sid, str) or not sid:
            raise ValueError("session_params.id must be a session id (a string from /open_session)")
        if rid is not None and not isinstance(rid, str):
            raise ValueError("session_params.rid must be a string (a previous request's id) or null")
        return cls(sid, rid)


@dataclass
class GenerateItem:
    """One prompt of a (possibly batched) request, before expansion into n samples."""
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    rid: str
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    compress: bool = True  # False: dense KV for this request (e.g. a dense evaluation)
    compress_budget: int | None = None  # B for this request (None: the server's); checked at intake
    return_eviction_record: bool = False  # meta_info.eviction_record when the request finishes
    session: SessionParams | None = None  # continue a session's request (engine/sessions.py)
    # Set by the OpenAI routes, not a JSON field: max_new_tokens reaching past the context is
    # SGLang's 400 there; /generate caps generation at the context instead.
    refuse_past_context: bool = False


def _pick(value: Any, i: int, batch: bool, name: str, size: int) -> Any:
    if batch and isinstance(value, list):
        if len(value) != size:
            raise ValueError(f"{name} has {len(value)} entries for a batch of {size}")
        return value[i]
    return value


def parse_generate(body: Any, sampling_defaults: dict | None = None) -> tuple[list[GenerateItem], bool]:
    """Validate a /generate body. Returns the items and whether the input was a batch."""
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    _check_extra_fields(body)
    if body.get("token_ids_logprob") is not None:
        raise ValueError("token_ids_logprob is not supported by this server")
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None and ids is not None:
        raise ValueError("Either text or input_ids should be provided, not both")
    if text is None and ids is None:
        raise ValueError("Either text or input_ids should be provided")

    if text is not None:
        batch = isinstance(text, list)
        prompts = text if batch else [text]
        for t in prompts:
            if not isinstance(t, str):
                raise ValueError("text must be a string or a list of strings")
            if not t:
                raise ValueError("text must not be empty")
    else:
        if not isinstance(ids, list) or not ids:
            raise ValueError("input_ids must be a non-empty list of token ids")
        batch = isinstance(ids[0], list)
        prompts = ids if batch else [ids]
        for p in prompts:
            if not isinstance(p, list) or not p:
                raise ValueError("input_ids must not be empty")
            if set(map(type, p)) != {int}:  # C-speed over 32k ids; bools and floats fail
                raise ValueError("input_ids must contain only integers")
    if batch and not prompts:
        raise ValueError("empty batch")

    size = len(prompts)
    items = []
    for i, prompt in enumerate(prompts):
        get = lambda k, d=None: _pick(body.get(k, d), i, batch, k, size)  # noqa: E731
        params = SamplingParams.from_dict(get("sampling_params"), sampling_defaults)
        rid = get("rid") or uuid.uuid4().hex
        item = GenerateItem(
            text=prompt if text is not None else None,
            input_ids=None if text is not None else list(prompt),
            params=params, rid=str(rid),
            return_logprob=get("return_logprob", False),
            logprob_start_len=get("logprob_start_len", -1),
            top_logprobs_num=get("top_logprobs_num", 0) or 0,
            return_text_in_logprobs=get("return_text_in_logprobs", False),
            stream=bool(body.get("stream", False)),
            compress=get("compress", True),
            compress_budget=get("compress_budget"),
            return_eviction_record=get("return_eviction_record", False),
            session=SessionParams.parse(get("session_params")),
        )
        if item.session is not None and item.params.n != 1:
            raise ValueError("a session request must have n = 1 (each sample in its own session)")
        for name in ("return_logprob", "compress", "return_eviction_record"):
            if not isinstance(getattr(item, name), bool):
                raise ValueError(f"{name} must be a boolean")
        for name in ("logprob_start_len", "top_logprobs_num"):
            v = getattr(item, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an integer")
        b = item.compress_budget
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError("compress_budget must be a positive integer")
        if item.top_logprobs_num < 0:
            raise ValueError("top_logprobs_num must be >= 0")
        if not item.return_logprob:
            item.top_logprobs_num, item.logprob_start_len = 0, -1
        items.append(item)
    rids = [it.rid for it in items]
    if len(set(rids)) != len(rids):
        raise ValueError("duplicate rid in batch")
    return items, batch
