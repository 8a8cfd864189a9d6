"""What every route shares: reading request bodies, the native error shape, server-sent events,
the bridge from engine callbacks to the event loop, waiting for results while watching for the
client leaving, and the `get_engine` dependency.

Bad input raises `BadRequest` (a ValueError); app.py turns it into HTTP 400
`{"error": {"message": ...}}`. A client that leaves (before, during or after sending its body)
raises `ClientGone`: its samples are aborted and app.py logs one line, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ..compression import eviction_record
from ..engine.engine import Engine


log = logging.getLogger("sglang_kvc.server")


class BadRequest(ValueError):
    pass


class ClientGone(Exception):
    """The client closed its connection before its response was sent."""


def get_engine(request: Request) -> Engine:
    """Route dependency: the engine `create_app` put on the app's state."""
    return request.app.state.engine


def error_response(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def read_raw(request: Request) -> bytes:
    try:
        return await request.body()
    except ClientDisconnect as e:
        raise ClientGone("before sending its whole request body") from e


async def read_json(request: Request, allow_empty: bool = True) -> Any:
    raw = await read_raw(request)
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest("request body is empty")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON: {e}") from e


async def read_object(request: Request) -> dict:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def jsonable(out: dict) -> dict:
    """An output dict as JSON: the eviction record (a tensor in-process) as base64 bytes."""
    meta = out.get("meta_info", {})
    if "eviction_record" not in meta:
        return out
    meta = dict(meta, eviction_record=eviction_record.encode(meta["eviction_record"]))
    return dict(out, meta_info=meta)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def sample_order(items) -> dict[str, int]:
    """Each sample's id -> its index, prompt-major then sample (the engine names the samples of
    an n > 1 request `{rid}-{j}`), so streamed updates can be told apart in any arrival order."""
    order: dict[str, int] = {}
    for it in items:
        for j in range(it.params.n):
            order[it.rid if it.params.n == 1 else f"{it.rid}-{j}"] = len(order)
    return order


def stream_bridge(engine: Engine, items) -> tuple[asyncio.Queue, list]:
    """Submit items; their updates arrive on an asyncio queue as (index, output, finished)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    # Indices are assigned before submitting, so none is missing when the first update arrives.
    index_of = sample_order(items)

    def on_update(out: dict, finished: bool) -> None:  # runs on the engine's thread
        idx = index_of.setdefault(out["meta_info"]["id"], len(index_of))
        loop.call_soon_threadsafe(q.put_nowait, (idx, out, finished))

    futures = engine.submit(items, on_update=on_update)
    return q, futures


def abort_soon(engine: Engine, rids: list[str]) -> None:
    """Abort the rids without blocking the event loop (the engine answers between steps)."""
    asyncio.get_running_loop().run_in_executor(None, engine.abort_requests, rids)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _settle(fut: asyncio.Future) -> None:
    """Mark a future's outcome as seen: a cancelled gather ends with a CancelledError set as
    its exception, which asyncio logs at collection ("_GatheringFuture exception was never
    retrieved") unless someone reads it."""
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


async def results_or_abort(request: Request, engine: Engine, items, futures) -> list[dict]:
    """The futures' results; if the client leaves first (uvicorn does not cancel a handler
    whose client left), its samples are aborted and `ClientGone` is raised."""
    results = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    _settle(results)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({results, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # server shutting down past its grace period
        results.cancel()
        abort_soon(engine, [it.rid for it in items])
        raise
    finally:
        watch.cancel()
    if results in done:
        return results.result()
    results.cancel()
    abort_soon(engine, [it.rid for it in items])
    raise ClientGone(f"while its {len(futures)} sample(s) were generating: aborted them")


def log_gone(request: Request, why: str) -> None:
    log.info("client %s left %s %s", _peer(request), request.url.path, why)


def _peer(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else "?"
