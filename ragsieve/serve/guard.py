"""ASGI middleware in front of every route: request ids, access log, API key, body size.

It runs before FastAPI parses anything, so an oversized body is refused (413) without
being parsed and a missing key (401) costs no model time. Every response carries
``x-request-id`` (the client's, if it sent one) and every log line names it. Behind Ray Serve's
proxy, which sets that header itself (the client's id, else one it makes and passes in), the
Guard uses the proxy's id and leaves the header to it (``echo_request_id=False``), so it is sent once.
A Ray Serve replica (``replica=``) also names itself on every response (``x-ragsieve-replica``), as
``/health`` does: which replica answered a request, without a request of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragsieve.serve.metrics import ServeMetrics

log = logging.getLogger("ragsieve.serve")

#: liveness and readiness probes answer without the API key (/metrics needs it, like every other path)
OPEN_PATHS = frozenset({"/health", "/ready"})
#: what a 503 tells the client: retry in a second (another replica, or this one once it is back)
RETRY_AFTER = (b"retry-after", b"1")


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def send_error(send, status: int, message: str, request_id: str, extra_headers=(), echo: bool = True) -> None:
    body = json.dumps({"error": message, "request_id": request_id}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *([(b"x-request-id", request_id.encode())] if echo else []),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _with_header(send, name: bytes, value: bytes):
    """``send`` adding one header to the response start."""

    async def send_with_header(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (name, value)]}
        await send(message)

    return send_with_header


class Guard:
    """Request id + access log, API key check (all paths but /health), body-size cap."""

    def __init__(self, app, *, api_key: str | None, max_body_bytes: int, echo_request_id: bool = True,
                 replica: str | None = None, metrics: "ServeMetrics | None" = None,
                 routes: frozenset[str] = frozenset(), stopping: Callable[[], bool] = lambda: False):
        self.app = app
        self.stopping = stopping  # True once the server stops: new requests are refused (503 + Retry-After)
        self.metrics = metrics
        self.routes = routes  # metric labels: the app's paths; any other path counts as "other" (bounded labels)
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.echo_request_id = echo_request_id
        self.replica = replica

    def _authorised(self, scope) -> bool:
        if not self.api_key or scope["path"] in OPEN_PATHS:
            return True
        given = _header(scope, b"x-api-key") or _header(scope, b"api-key")
        auth = _header(scope, b"authorization") or ""
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return given is not None and secrets.compare_digest(given.encode(), self.api_key.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.replica is not None:  # errors answered here (401, 413) name the replica too
            send = _with_header(send, b"x-ragsieve-replica", self.replica.encode())
        # a client-chosen id is kept only if it is short and printable (it goes into logs)
        given = _header(scope, b"x-request-id")
        rid = given if given and len(given) <= 64 and given.isprintable() else uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid
        start = time.perf_counter()
        logged = False
        started = False

        def log_status(code: int) -> None:
            # logged when the status is known, before the response leaves: a client that reads
            # the response and then the log never misses the line
            nonlocal logged
            if not logged:
                logged = True
                seconds = time.perf_counter() - start
                ms = seconds * 1000
                if self.metrics is not None:
                    route = scope["path"] if scope["path"] in self.routes else "other"
                    self.metrics.requests.labels(route=route, status=str(code)).inc()
                    self.metrics.latency.labels(route=route).observe(seconds)
                log.info("rid=%s %s %s %s %.1fms", rid, scope["method"], scope["path"], code, ms)

        async def send_logged(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                log_status(message["status"])
                if self.echo_request_id:
                    message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        async def refuse(status: int, message: str, headers=()) -> None:
            log_status(status)
            await send_error(send, status, message, rid, headers, self.echo_request_id)

        try:
            if not self._authorised(scope):
                await refuse(401, "missing or wrong API key (Authorization: Bearer <key>)",
                             [(b"www-authenticate", b"Bearer")])
                return
            if self.stopping() and scope["path"] not in OPEN_PATHS:
                await refuse(503, "the server is shutting down; retry", [RETRY_AFTER, (b"connection", b"close")])
                return
            body = await self._read_body(scope, receive)
            if body is None:
                await refuse(413, f"body: larger than max_body_bytes ({self.max_body_bytes})")
                return
            await self.app(scope, _replay(body), send_logged)
        except asyncio.CancelledError:
            # the shutdown's grace ran out under this request: a 503 the client may retry, not a reset
            if started:
                raise
            asyncio.current_task().uncancel()
            await refuse(503, "the server stopped before this request was scored; retry", [RETRY_AFTER])
        except Exception:
            log_status(500)  # answered 500 by the error middleware outside this one
            raise
        finally:
            log_status(0)  # no response was started (client gone, or a crash below us)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The whole body, or None when it exceeds the cap (checked on the header first, then on the bytes)."""
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return None
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # after the body, wait like a real connection would until the response is done
        import asyncio

        await asyncio.Event().wait()

    return receive
