"""The FastAPI app over an Engine: SGLang's native endpoints (engine.md §4) and OpenAI's /v1,
assembled from the route modules, plus `ServerThread` to serve it in-process.

Bad input is HTTP 400 `{"error": {"message": ...}}` on the native routes and OpenAI's error shape
on /v1 (the handlers below pick by exception class); a full queue is 503 with Retry-After
(engine/admission.py); a client that left is one log line.
"""

from __future__ import annotations

import threading

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from ..engine.admission import QueueFull
from ..engine.engine import Engine
from . import native_routes, openai_routes, weight_routes
from .auth import ApiKeyMiddleware
from .http_io import BadRequest, ClientGone, error_response, log_gone
from .openai_routes import OpenAIError, openai_error_handler


async def _client_error(_request: Request, exc: Exception):
    return error_response(str(exc))


async def _busy(_request: Request, exc: Exception):
    resp = error_response(str(exc), status=503)
    resp.headers["Retry-After"] = "1"
    return resp


async def _client_gone(request: Request, exc: Exception):
    """One log line, no traceback: nobody reads this response (499: nginx's "client closed")."""
    log_gone(request, str(exc) if isinstance(exc, ClientGone) else "mid-request")
    return Response(status_code=499)


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="sglang-kvc")
    app.state.engine = engine  # what the routes' `get_engine` dependency returns
    # The engine's validation raises ValueError, the weight loader FileNotFoundError for a path
    # without checkpoints: both are about the client's input. OpenAIError is a ValueError too, but
    # Starlette picks the handler of the closest class, so /v1 keeps OpenAI's error shape.
    for exc in (BadRequest, ValueError, FileNotFoundError):
        app.add_exception_handler(exc, _client_error)
    app.add_exception_handler(OpenAIError, openai_error_handler)
    app.add_exception_handler(QueueFull, _busy)
    for exc in (ClientGone, ClientDisconnect):
        app.add_exception_handler(exc, _client_gone)
    for module in (native_routes, weight_routes, openai_routes):
        app.include_router(module.router)
    if engine.args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=engine.args.api_key)
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
