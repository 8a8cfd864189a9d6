"""FastAPI app exposing an Engine with SGLang's native endpoints (engine.md §4) and OpenAI's /v1.

Handlers never block the event loop: engine commands run in a thread pool and generation
results come back through futures. Bad input is HTTP 400 `{"error": {"message": ...}}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..engine.engine import Engine
from ..engine.io_struct import parse_generate

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    pass


def error_response(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def read_json(request: Request, allow_empty: bool = True) -> Any:
    raw = await request.body()
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


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def stream_bridge(engine: Engine, items) -> tuple[asyncio.Queue, list]:
    """Submit items; their updates arrive on an asyncio queue as (index, output, finished)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    index_of: dict[str, int] = {}

    def on_update(out: dict, finished: bool) -> None:
        idx = index_of.setdefault(out["meta_info"]["id"], len(index_of))
        loop.call_soon_threadsafe(q.put_nowait, (idx, out, finished))

    # Assign indices in submission order (prompt-major, then sample) before any update arrives.
    for it in items:
        for j in range(it.params.n):
            index_of[it.rid if it.params.n == 1 else f"{it.rid}-{j}"] = len(index_of)
    futures = engine.submit(items, on_update=on_update)
    return q, futures


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="sglang-kvc")
    app.state.engine = engine

    @app.exception_handler(BadRequest)
    async def _bad_request(_req, exc):
        return error_response(str(exc))

    @app.exception_handler(ValueError)
    async def _value_error(_req, exc):
        return error_response(str(exc))

    @app.exception_handler(FileNotFoundError)
    async def _not_found(_req, exc):
        return error_response(str(exc))

    # ------------------------------------------------------------ generation

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await read_object(request)
        items, is_batch = parse_generate(body, engine.sampling_defaults)
        if items[0].stream:
            q, futures = stream_bridge(engine, items)
            multi = is_batch or len(futures) > 1
            rids = [it.rid for it in items]

            async def events():
                remaining = len(futures)
                try:
                    while remaining:
                        idx, out, finished = await q.get()
                        remaining -= finished
                        if multi:
                            out = dict(out, index=idx)
                        yield sse(out)
                    yield "data: [DONE]\n\n"
                finally:
                    if remaining:  # client went away: stop generating for it
                        for rid in rids:
                            engine.abort_request(rid)

            return StreamingResponse(events(), media_type="text/event-stream")
        futures = engine.submit(items)
        try:
            results = [await asyncio.wrap_future(f) for f in futures]
        except asyncio.CancelledError:
            for it in items:
                engine.abort_request(it.rid)
            raise
        return JSONResponse(results if (is_batch or len(results) > 1) else results[0])

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.is_alive() else 503)

    @app.get("/health_generate")
    async def health_generate():
        items, _ = parse_generate({"input_ids": [0], "sampling_params": {
            "max_new_tokens": 1, "temperature": 0.0}})
        try:
            fut = engine.submit(items)[0]
            await asyncio.wait_for(asyncio.wrap_future(fut), timeout=60)
        except Exception:  # noqa: BLE001
            return Response(status_code=503)
        return Response(status_code=200)

    # ------------------------------------------------------------ info

    @app.get("/get_model_info")
    async def get_model_info():
        return engine.get_model_info()

    @app.get("/get_server_info")
    async def get_server_info():
        return engine.get_server_info()

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": engine.weight_version}

    # ------------------------------------------------------------ control

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if await run_in_threadpool(engine.flush_cache):
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.")
        return PlainTextResponse("Cache not flushed: requests are in flight.", status_code=400)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_object(request)
        await run_in_threadpool(engine.abort_request, str(body.get("rid") or ""),
                                bool(body.get("abort_all", False)))
        return Response(status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await read_object(request)
        await run_in_threadpool(engine.pause_generation, body.get("mode") or "in_place")
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        await read_json(request)
        await run_in_threadpool(engine.continue_generation)
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def _weights_call(fn, body: dict, keys: tuple[str, ...], required: tuple[str, ...] = ()):
        missing = [k for k in required if k not in body]
        if missing:
            raise BadRequest(f"missing field(s): {', '.join(missing)}")
        kwargs = {k: body[k] for k in keys if k in body}
        try:
            return await run_in_threadpool(fn, **kwargs)
        except (ValueError, FileNotFoundError, TypeError) as e:
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)

    common = ("weight_version", "abort_all_requests", "flush_cache", "load_format")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await read_object(request)
        return await _weights_call(engine.update_weights_from_disk, body, ("model_path",) + common,
                                   ("model_path",))

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request):
        body = await read_object(request)
        return await _weights_call(engine.update_weights_from_tensor, body,
                                   ("serialized_named_tensors",) + common, ("serialized_named_tensors",))

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        body = await read_object(request)
        keys = ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend")
        return await _weights_call(engine.init_weights_update_group, body, keys, keys[:4])

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        body = await read_object(request)
        return await _weights_call(engine.update_weights_from_distributed, body,
                                   ("names", "dtypes", "shapes", "group_name") + common,
                                   ("names", "dtypes", "shapes"))

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        body = await read_object(request)
        return await _weights_call(engine.destroy_weights_update_group, body, ("group_name",))

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request):
        body = await read_object(request)
        return await _weights_call(engine.get_weights_by_name, body, ("name", "truncate_size"),
                                   ("name",))

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(request: Request):
        body = await read_object(request)
        await run_in_threadpool(engine.release_memory, body.get("tags"))
        return {"success": True, "message": "memory released"}

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(request: Request):
        body = await read_object(request)
        await run_in_threadpool(engine.resume_memory, body.get("tags"))
        return {"success": True, "message": "memory resumed"}

    from .openai_api import add_openai_routes

    add_openai_routes(app, engine)
    return app


class ServerThread:
    """uvicorn serving `create_app(engine)` in a background thread (tests, colocated use)."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 30000,
                 log_level: str = "warning"):
        import uvicorn

        config = uvicorn.Config(create_app(engine), host=host, port=port, log_level=log_level)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="sglang-kvc-http", daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        import time

        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("HTTP server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
