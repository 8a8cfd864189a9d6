"""OpenAI-compatible /v1/completions, /v1/chat/completions and /v1/models on top of the engine.

Requests are translated into the native GenerateItem form (so validation is shared); errors use
OpenAI's error shape so the official client raises BadRequestError with the message.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..engine.engine import Engine
from ..engine.io_struct import parse_generate

# OpenAI field -> native sampling parameter.
_SAMPLING_MAP = {
    "max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "n": "n", "stop": "stop", "seed": "sampling_seed", "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens", "stop_token_ids": "stop_token_ids",
    "no_stop_trim": "no_stop_trim", "min_tokens": "min_new_tokens",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty", "regex": "regex", "json_schema": "json_schema",
    "logit_bias": "logit_bias", "spaces_between_special_tokens": "spaces_between_special_tokens",
}
_UNSUPPORTED = {"suffix": None, "tools": None, "functions": None, "response_format": None,
                "best_of": None}


class OpenAIError(ValueError):
    pass


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "param": None, "code": status}, status_code=status)


def _sampling(body: dict, default_max: int | None) -> dict:
    for k, neutral in _UNSUPPORTED.items():
        if body.get(k) not in (neutral, None) and not (k == "best_of" and body.get(k) == body.get("n", 1)):
            raise OpenAIError(f"{k} is not supported by this server")
    sp = {}
    for k, native in _SAMPLING_MAP.items():
        if body.get(k) is not None:
            sp[native] = body[k]
    if "max_new_tokens" not in sp and default_max is not None:
        sp["max_new_tokens"] = default_max
    return sp


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


def add_openai_routes(app: FastAPI, engine: Engine) -> None:
    model_name = engine.args.served_model_name or engine.args.model_path

    @app.exception_handler(OpenAIError)
    async def _openai_error(_req, exc):
        return _error(str(exc))

    async def _body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError as e:
            raise OpenAIError(f"malformed JSON: {e}") from e
        if not isinstance(body, dict):
            raise OpenAIError("request body must be a JSON object")
        return body

    def _submit(native: dict, on_update=None):
        try:
            items, _ = parse_generate(native, engine.sampling_defaults)
            return items, engine.submit(items, on_update=on_update)
        except ValueError as e:
            raise OpenAIError(str(e)) from e

    async def _stream(native: dict, make_chunk):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        items, futures = _submit(native, lambda out, fin: loop.call_soon_threadsafe(q.put_nowait, (out, fin)))
        order = {}
        for it in items:
            for j in range(it.params.n):
                order[it.rid if it.params.n == 1 else f"{it.rid}-{j}"] = len(order)
        sent = [0] * len(order)
        first = [True] * len(order)

        async def events():
            remaining = len(futures)
            try:
                while remaining:
                    out, fin = await q.get()
                    remaining -= fin
                    idx = order[out["meta_info"]["id"]]
                    delta = out["text"][sent[idx]:]
                    sent[idx] = len(out["text"])
                    yield f"data: {json.dumps(make_chunk(idx, delta, out, first[idx]))}\n\n"
                    first[idx] = False
                yield "data: [DONE]\n\n"
            finally:
                if remaining:
                    for it in items:
                        engine.abort_request(it.rid)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang-kvc",
            "root": model_name, "max_model_len": engine.context_length}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _body(request)
        prompt = body.get("prompt")
        if prompt is None:
            raise OpenAIError("prompt is required")
        native: dict = {"sampling_params": _sampling(body, 16)}
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            native["text"] = prompt
        else:
            native["input_ids"] = prompt
        logprobs = body.get("logprobs")
        if logprobs is not None:
            if not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0:
                raise OpenAIError("logprobs must be a non-negative integer")
            native.update(return_logprob=True, top_logprobs_num=logprobs, return_text_in_logprobs=True)
        echo = body.get("echo") or False
        if not isinstance(echo, bool):
            raise OpenAIError("echo must be a boolean")
        if echo and body.get("stream"):
            raise OpenAIError("echo is not supported together with stream")
        if echo and logprobs is not None:
            native["logprob_start_len"] = 0  # the prompt's own log-probs (lm-eval's loglikelihood)
        created, cid = int(time.time()), f"cmpl-{uuid.uuid4().hex}"

        if body.get("stream"):
            native["stream"] = True

            def chunk(idx, delta, out, _first):
                reason, matched = _finish(out["meta_info"])
                return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                        "choices": [{"index": idx, "text": delta, "logprobs": None,
                                     "finish_reason": reason, "matched_stop": matched}]}
            return await _stream(native, chunk)

        items, futures = _submit(native)
        outs = [await asyncio.wrap_future(f) for f in futures]
        n = body.get("n") or 1
        choices = []
        for i, out in enumerate(outs):
            reason, matched = _finish(out["meta_info"])
            prefix = _prompt_text(items[i // n], engine) if echo else ""
            choices.append({"index": i, "text": prefix + out["text"],
                            "logprobs": _completion_logprobs(out["meta_info"], logprobs, echo),
                            "finish_reason": reason, "matched_stop": matched})
        return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                "choices": choices, "usage": _usage(outs, n)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError("messages must be a non-empty list")
        if engine.tokenizer is None:
            raise OpenAIError("chat needs a tokenizer (server runs --skip-tokenizer-init)")
        try:
            text = engine.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True,
                **(body.get("chat_template_kwargs") or {}))
        except Exception as e:  # noqa: BLE001 - template errors are the client's input
            raise OpenAIError(f"cannot apply chat template: {e}") from e
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        default_max = max(1, engine.max_seq_len - len(ids) - 1)
        native: dict = {"input_ids": ids, "sampling_params": _sampling(body, default_max)}
        want_lp = bool(body.get("logprobs"))
        top_n = body.get("top_logprobs") or 0
        if want_lp:
            native.update(return_logprob=True, top_logprobs_num=top_n, return_text_in_logprobs=True)
        created, cid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"

        def chat_logprobs(out: dict):
            if not want_lp:
                return None
            meta = out["meta_info"]
            lps = meta.get("output_token_logprobs", [])
            tops = meta.get("output_top_logprobs") or [[] for _ in lps]
            content = []
            for (lp, _, tok), top in zip(lps, tops):
                tok = tok or ""
                content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                                "top_logprobs": [{"token": t or "", "logprob": v,
                                                  "bytes": list((t or "").encode())} for v, _, t in top]})
            return {"content": content}

        if body.get("stream"):
            native["stream"] = True

            def chunk(idx, delta_text, out, first):
                reason, matched = _finish(out["meta_info"])
                delta = {"content": delta_text}
                if first:
                    delta["role"] = "assistant"
                return {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": model_name, "choices": [{"index": idx, "delta": delta, "logprobs": None,
                                                          "finish_reason": reason, "matched_stop": matched}]}
            return await _stream(native, chunk)

        _, futures = _submit(native)
        outs = [await asyncio.wrap_future(f) for f in futures]
        choices = []
        for i, out in enumerate(outs):
            reason, matched = _finish(out["meta_info"])
            choices.append({"index": i, "message": {"role": "assistant", "content": out["text"],
                                                    "reasoning_content": None, "tool_calls": None},
                            "logprobs": chat_logprobs(out), "finish_reason": reason,
                            "matched_stop": matched})
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": choices, "usage": _usage(outs, body.get("n") or 1)}
