"""`--api-key`: SGLang's bearer-token check, and what counts as binding only this machine.

As SGLang's: with a key, every request but OPTIONS (CORS preflight) and the `/health` routes must
carry `Authorization: Bearer KEY`, else HTTP 401 `{"error": "Unauthorized"}`. A plain ASGI
middleware rather than Starlette's `@app.middleware("http")`: the latter hides the client's
`http.disconnect` from the handlers, which watch for it to abort a departed client's samples.
"""

from __future__ import annotations

import hmac
import ipaddress
import json


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _exempt(scope) or self._authorized(scope):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)  # no timing hint about the key


def _exempt(scope) -> bool:
    """What SGLang leaves open: preflight requests and the health checks (load balancers)."""
    return scope["method"] == "OPTIONS" or scope["path"].startswith("/health")


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False
