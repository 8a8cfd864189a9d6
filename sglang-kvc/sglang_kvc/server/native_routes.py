"""SGLang's native endpoints (engine.md §4): /generate, sessions, health checks, model and server
info, and the control routes (flush, abort, pause/continue).

Handlers never block the event loop: engine commands run in a thread pool and generation results
come back through futures.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..engine.engine import Engine
from ..engine.io_struct import parse_generate
from .http_io import (BadRequest, abort_soon, get_engine, jsonable, read_json, read_object,
                      results_or_abort, sse, stream_bridge)

router = APIRouter()
log = logging.getLogger("sglang_kvc.server")

# ------------------------------------------------------------ generation


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    items, is_batch = parse_generate(body, engine.sampling_defaults)
    if items[0].stream:
        return _stream_response(engine, items, is_batch)
    futures = engine.submit(items)
    results = [jsonable(r) for r in await results_or_abort(request, engine, items, futures)]
    return JSONResponse(results if (is_batch or len(results) > 1) else results[0])


def _stream_response(engine: Engine, items, is_batch: bool) -> StreamingResponse:
    q, futures = stream_bridge(engine, items)
    # A lone output streams as-is; several are told apart by an added "index".
    multi = is_batch or len(futures) > 1
    events = _events(engine, q, len(futures), [it.rid for it in items], multi)
    return StreamingResponse(events, media_type="text/event-stream")


async def _events(engine: Engine, q: asyncio.Queue, remaining: int, rids: list[str], multi: bool):
    try:
        while remaining:
            idx, out, finished = await q.get()
            remaining -= finished
            if multi:
                out = dict(out, index=idx)
            yield sse(jsonable(out))
        yield "data: [DONE]\n\n"
    finally:
        if remaining:  # client went away: stop generating for it
            abort_soon(engine, rids)
            log.info("streaming client left /generate with %d sample(s) unfinished: aborted",
                     remaining)


# ------------------------------------------------------------ sessions (engine/sessions.py)


@router.api_route("/open_session", methods=["GET", "POST"])
async def open_session(request: Request, engine: Engine = Depends(get_engine)):
    """SGLang's: {"capacity_of_str_len": int, "session_id"?: str} -> the session id (a JSON
    string)."""
    body = await read_object(request)
    unknown = sorted(set(body) - {"capacity_of_str_len", "session_id"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    sid = await run_in_threadpool(engine.open_session, body.get("capacity_of_str_len", 0),
                                  body.get("session_id"))
    return JSONResponse(sid)


@router.api_route("/close_session", methods=["GET", "POST"])
async def close_session(request: Request, engine: Engine = Depends(get_engine)):
    """SGLang's: {"session_id": str}; frees the KV the session's requests hold."""
    body = await read_object(request)
    if "session_id" not in body:
        raise BadRequest("session_id is required")
    await run_in_threadpool(engine.close_session, body["session_id"])
    return Response(status_code=200)


@router.get("/health")
async def health(engine: Engine = Depends(get_engine)):
    return Response(status_code=200 if engine.is_alive() else 503)


@router.get("/health_generate")
async def health_generate(engine: Engine = Depends(get_engine)):
    items, _ = parse_generate({"input_ids": [0], "sampling_params": {
        "max_new_tokens": 1, "temperature": 0.0}})
    try:
        fut = engine.submit(items)[0]
        await asyncio.wait_for(asyncio.wrap_future(fut), timeout=60)
    except Exception:  # noqa: BLE001
        return Response(status_code=503)
    return Response(status_code=200)

# ------------------------------------------------------------ info


@router.get("/get_model_info")
async def get_model_info(engine: Engine = Depends(get_engine)):
    return engine.get_model_info()


@router.get("/get_server_info")
async def get_server_info(engine: Engine = Depends(get_engine)):
    return engine.get_server_info()


@router.get("/get_weight_version")
async def get_weight_version(engine: Engine = Depends(get_engine)):
    return {"weight_version": engine.weight_version}

# ------------------------------------------------------------ control


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(engine: Engine = Depends(get_engine)):
    if await run_in_threadpool(engine.flush_cache):
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.")
    return PlainTextResponse("Cache not flushed: requests are in flight.", status_code=400)


@router.post("/abort_request")
async def abort_request(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    await run_in_threadpool(engine.abort_request, str(body.get("rid") or ""),
                            bool(body.get("abort_all", False)))
    return Response(status_code=200)


@router.post("/pause_generation")
async def pause_generation(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    await run_in_threadpool(engine.pause_generation, body.get("mode") or "in_place")
    return {"message": "Generation paused successfully.", "status": "ok"}


@router.post("/continue_generation")
async def continue_generation(request: Request, engine: Engine = Depends(get_engine)):
    await read_json(request)  # no fields, but malformed JSON is still a 400
    await run_in_threadpool(engine.continue_generation)
    return {"message": "Generation continued successfully.", "status": "ok"}
