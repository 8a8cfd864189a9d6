"""OpenAI-compatible /v1/completions, /v1/chat/completions and /v1/models on top of the engine.

Requests are translated into the native GenerateItem form, so validation is shared with
/generate; its messages name the field the user sent (`max_tokens`, not `max_new_tokens`).
Which fields are taken, ignored or refused: openai_fields.py. `max_tokens` reaching past the
context is SGLang's 400. Errors use OpenAI's error shape so the official client raises
BadRequestError with the message (a full queue: 503, which the client retries).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..engine.admission import QueueFull
from ..engine.engine import Engine
from ..engine.io_struct import parse_generate
from .http_io import abort_soon, get_engine, read_raw, results_or_abort, sample_order, sse
from .openai_fields import (SAMPLING, OpenAIError, check_fields, request_id, sampling,
                            stream_options, template_kwargs)
from .openai_tools import AnswerStream, ToolPlan, answer_message, template_messages, template_tools, tool_plan

router = APIRouter()
log = logging.getLogger("sglang_kvc.server")


def _error(message: str, status: int = 400) -> JSONResponse:
    kind = "BadRequestError" if status == 400 else "ServiceUnavailableError"
    resp = JSONResponse({"object": "error", "message": message, "type": kind,
                         "param": None, "code": status}, status_code=status)
    if status == 503:
        resp.headers["Retry-After"] = "1"
    return resp


async def openai_error_handler(_request: Request, exc: OpenAIError) -> JSONResponse:
    return _error(str(exc), exc.status)


def _user_names(message: str, body: dict) -> str:
    """The shared validation's message with the native names the user did not send replaced by
    the OpenAI field they did (max_new_tokens -> max_tokens, input_ids -> prompt)."""
    aliases = [(k, v) for k, v in SAMPLING.items() if k != v and k in body]
    if "prompt" in body:
        aliases += [("prompt", "input_ids"), ("prompt", "text")]
    for user, native in aliases:
        message = re.sub(rf"\b{native}\b", user, message)
    return message


def _model_name(engine: Engine) -> str:
    return engine.args.served_model_name or engine.args.model_path


def _finish(meta: dict) -> tuple[str | None, object]:
    reason = meta.get("finish_reason")
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


def _usage(outs: list[dict], n: int) -> dict:
    # Outputs are prompt-major with n samples each: count every prompt once.
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs[::n])
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _head(engine: Engine, prefix: str) -> dict:
    """The id, creation time and model that every chunk and the response of one request repeat."""
    return {"created": int(time.time()), "id": f"{prefix}-{uuid.uuid4().hex}",
            "model": _model_name(engine)}


def _envelope(head: dict, obj: str, choices: list, **rest) -> dict:
    return {"id": head["id"], "object": obj, "created": head["created"], "model": head["model"],
            "choices": choices, **rest}

# ------------------------------------------------------------ submitting and streaming


async def _body(request: Request, route: str) -> dict:
    raw = await read_raw(request)
    try:
        body = json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError as e:
        raise OpenAIError(f"malformed JSON: {e}") from e
    if not isinstance(body, dict):
        raise OpenAIError("request body must be a JSON object")
    check_fields(body, route)
    return body


def _submit(engine: Engine, native: dict, body: dict, on_update=None):
    try:
        items, _ = parse_generate(native, engine.sampling_defaults)
        for it in items:  # SGLang's 400 for max_tokens past the context, not a silent cap
            it.refuse_past_context = True
        return items, engine.submit(items, on_update=on_update)
    except QueueFull as e:
        raise OpenAIError(str(e), status=503) from e
    except ValueError as e:
        raise OpenAIError(_user_names(str(e), body)) from e


async def _results(request: Request, engine: Engine, native: dict,
                   body: dict) -> tuple[list, list[dict]]:
    items, futures = _submit(engine, native, body)
    return items, await results_or_abort(request, engine, items, futures)


@dataclass
class _StreamPlan:
    make_chunk: Callable  # (index, new text, output, is first) -> chunk
    usage_chunk: Callable | None  # (final outputs, prompt-major) -> the closing usage chunk
    continuous_usage: bool  # each chunk carries its sample's usage so far


def _stream_plan(body: dict, head: dict, obj: str, make_chunk) -> _StreamPlan:
    include, continuous = stream_options(body)
    n = body.get("n") or 1
    usage = (lambda outs: _envelope(head, obj, [], usage=_usage(outs, n))) if include else None
    return _StreamPlan(functools.partial(make_chunk, head), usage, continuous)


async def _stream(engine: Engine, native: dict, body: dict, plan: _StreamPlan) -> StreamingResponse:
    """Submit `native` (errors are still a 400 here) and stream a chunk for every update."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    items, futures = _submit(engine, native, body,
                             lambda out, fin: loop.call_soon_threadsafe(q.put_nowait, (out, fin)))
    events = _events(engine, q, items, len(futures), plan)
    return StreamingResponse(events, media_type="text/event-stream")


async def _events(engine: Engine, q: asyncio.Queue, items, remaining: int, plan: _StreamPlan):
    order = sample_order(items)
    sent = [0] * len(order)  # characters of each sample's text already sent
    first = [True] * len(order)
    finals: list = [None] * len(order)
    try:
        while remaining:
            out, fin = await q.get()
            remaining -= fin
            idx = order[out["meta_info"]["id"]]
            delta = out["text"][sent[idx]:]
            sent[idx] = len(out["text"])
            chunk = plan.make_chunk(idx, delta, out, first[idx])
            if plan.continuous_usage:
                chunk["usage"] = _usage([out], 1)
            yield sse(chunk)
            first[idx] = False
            finals[idx] = out if fin else None
        if plan.usage_chunk is not None:
            yield sse(plan.usage_chunk(finals))
        yield "data: [DONE]\n\n"
    finally:
        if remaining:  # client went away: stop generating for it
            abort_soon(engine, [it.rid for it in items])
            log.info("streaming client left with %d sample(s) unfinished: aborted", remaining)

# ------------------------------------------------------------ /v1/models


@router.get("/v1/models")
async def models(engine: Engine = Depends(get_engine)):
    name = _model_name(engine)
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang-kvc",
        "root": name, "max_model_len": engine.context_length}]}

# ------------------------------------------------------------ /v1/completions


@router.post("/v1/completions")
async def completions(request: Request, engine: Engine = Depends(get_engine)):
    body = await _body(request, "completions")
    native, logprobs, echo = _completion_request(body)
    head = _head(engine, "cmpl")
    if body.get("stream"):
        native["stream"] = True
        return await _stream(engine, native, body,
                             _stream_plan(body, head, "text_completion", _completion_chunk))
    items, outs = await _results(request, engine, native, body)
    n = body.get("n") or 1
    choices = [_completion_choice(engine, i, out, items[i // n], logprobs, echo)
               for i, out in enumerate(outs)]
    return _envelope(head, "text_completion", choices, usage=_usage(outs, n))


def _completion_request(body: dict) -> tuple[dict, int | None, bool]:
    """The native request for a completions body, with its `logprobs` and `echo` options."""
    prompt = body.get("prompt")
    if prompt is None:
        raise OpenAIError("prompt is required")
    native: dict = {"sampling_params": sampling(body, 16), **request_id(body)}
    # A string or a list of strings is text; anything else is token ids (one prompt or a batch).
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        native["text"] = prompt
    else:
        native["input_ids"] = prompt
    logprobs = _logprobs_option(body, native)
    return native, logprobs, _echo_option(body, native, logprobs)


def _logprobs_option(body: dict, native: dict) -> int | None:
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0:
            raise OpenAIError("logprobs must be a non-negative integer")
        native.update(return_logprob=True, top_logprobs_num=logprobs, return_text_in_logprobs=True)
    return logprobs


def _echo_option(body: dict, native: dict, logprobs: int | None) -> bool:
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise OpenAIError("echo must be a boolean")
    if echo and body.get("stream"):
        raise OpenAIError("echo is not supported together with stream")
    if echo and logprobs is not None:
        native["logprob_start_len"] = 0  # the prompt's own log-probs (lm-eval's loglikelihood)
    return echo


def _completion_chunk(head: dict, idx: int, delta: str, out: dict, _first: bool) -> dict:
    reason, matched = _finish(out["meta_info"])
    return _envelope(head, "text_completion", [{"index": idx, "text": delta, "logprobs": None,
                                                "finish_reason": reason, "matched_stop": matched}])


def _completion_choice(engine: Engine, i: int, out: dict, item, logprobs: int | None, echo: bool) -> dict:
    reason, matched = _finish(out["meta_info"])
    prefix = _prompt_text(item, engine) if echo else ""
    return {"index": i, "text": prefix + out["text"],
            "logprobs": _completion_logprobs(out["meta_info"], logprobs, echo),
            "finish_reason": reason, "matched_stop": matched}


def _prompt_text(item, engine: Engine) -> str:
    """The prompt as text for ``echo`` (token-id prompts are decoded, as OpenAI servers do)."""
    if item.text is not None:
        return item.text
    if engine.tokenizer is None:
        raise OpenAIError("echo of a token-id prompt needs a tokenizer (server runs --skip-tokenizer-init)")
    return engine.tokenizer.decode(item.input_ids)


def _completion_logprobs(meta: dict, logprobs: int | None, echo: bool) -> dict | None:
    """OpenAI's completion ``logprobs`` object; with ``echo`` the prompt's tokens come first
    (the first one has no log-prob: nothing precedes it)."""
    if logprobs is None:
        return None
    entries = (meta.get("input_token_logprobs") or []) if echo else []
    tops = (meta.get("input_top_logprobs") or [None] * len(entries)) if echo else []
    entries = entries + meta.get("output_token_logprobs", [])
    tops = tops + (meta.get("output_top_logprobs") or [None] * len(meta.get("output_token_logprobs", [])))
    tokens = [t or "" for _, _, t in entries]
    offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:len(tokens)]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _, _ in entries], "text_offset": offsets,
            "top_logprobs": [None if top is None else {(t or ""): lp for lp, _, t in top}
                             for top in tops] if logprobs else None}

# ------------------------------------------------------------ /v1/chat/completions


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, engine: Engine = Depends(get_engine)):
    body = await _body(request, "chat")
    tools = tool_plan(engine.args.tool_call_parser, body)
    native = _chat_request(engine, body, tools.prefill)
    head = _head(engine, "chatcmpl")
    if body.get("stream"):
        native["stream"] = True
        return await _stream(engine, native, body, _stream_plan(
            body, head, "chat.completion.chunk", functools.partial(_chat_chunk, _ChatStreams(tools))))
    _, outs = await _results(request, engine, native, body)
    want_lp = bool(body.get("logprobs"))
    choices = [_chat_choice(tools, i, out, want_lp) for i, out in enumerate(outs)]
    return _envelope(head, "chat.completion", choices, usage=_usage(outs, body.get("n") or 1))


def _chat_request(engine: Engine, body: dict, prefill: str) -> dict:
    ids = _chat_prompt_ids(engine, body, prefill)
    # Unless the client caps it, the answer may fill the rest of the context.
    default_max = max(1, engine.max_seq_len - len(ids) - 1)
    native: dict = {"input_ids": ids, "sampling_params": sampling(body, default_max),
                    **request_id(body)}
    if not isinstance(body.get("logprobs") or False, bool):
        raise OpenAIError("logprobs must be a boolean on /v1/chat/completions")
    if body.get("logprobs"):
        native.update(return_logprob=True, top_logprobs_num=body.get("top_logprobs") or 0,
                      return_text_in_logprobs=True)
    return native


def _chat_prompt_ids(engine: Engine, body: dict, prefill: str) -> list[int]:
    """The prompt's token ids; ``prefill`` (a forced tool call's opening) follows the
    generation prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list")
    kwargs = template_kwargs(body, template_tools(body))
    if body.get("input_ids") is not None:  # SGLang's: the client tokenized the prompt itself
        if not isinstance(body["input_ids"], list) or not body["input_ids"]:
            raise OpenAIError("input_ids must be a non-empty list of token ids")
        return body["input_ids"]
    if engine.tokenizer is None:
        raise OpenAIError("chat needs a tokenizer (server runs --skip-tokenizer-init)")
    messages = template_messages(messages, engine.args.tool_call_parser,
                                 str(engine.tokenizer.chat_template or ""))
    try:
        text = engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs) + prefill
    except Exception as e:  # noqa: BLE001 - template errors are the client's input
        raise OpenAIError(f"cannot apply chat template: {e}") from e
    # The template already wrote the special tokens (BOS included): don't add them twice.
    return engine.tokenizer.encode(text, add_special_tokens=False)


class _ChatStreams:
    """Each streamed choice's AnswerStream (its tool-call parsing state), made on first use."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.streams = plan, {}

    def __call__(self, idx: int) -> AnswerStream:
        return self.streams.setdefault(idx, AnswerStream(self.plan))


def _chat_chunk(streams: _ChatStreams, head: dict, idx: int, _delta_text: str, out: dict,
                first: bool) -> dict:
    reason, matched = _finish(out["meta_info"])
    delta, reason = streams(idx).delta(out["text"], reason)
    if first:  # OpenAI sends the role once, in a choice's first chunk
        delta["role"] = "assistant"
    return _envelope(head, "chat.completion.chunk", [{"index": idx, "delta": delta, "logprobs": None,
                                                      "finish_reason": reason, "matched_stop": matched}])


def _chat_choice(tools: ToolPlan, i: int, out: dict, want_lp: bool) -> dict:
    reason, matched = _finish(out["meta_info"])
    message, reason = answer_message(tools, out["text"], reason)
    return {"index": i, "message": {**message, "reasoning_content": None},
            "logprobs": _chat_logprobs(out["meta_info"]) if want_lp else None,
            "finish_reason": reason, "matched_stop": matched}


def _chat_logprobs(meta: dict) -> dict:
    """OpenAI's chat ``logprobs`` object: per output token its log-prob, bytes and top
    alternatives."""
    lps = meta.get("output_token_logprobs", [])
    tops = meta.get("output_top_logprobs") or [[] for _ in lps]
    content = []
    for (lp, _, tok), top in zip(lps, tops):
        tok = tok or ""
        content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                        "top_logprobs": [{"token": t or "", "logprob": v,
                                          "bytes": list((t or "").encode())} for v, _, t in top]})
    return {"content": content}
