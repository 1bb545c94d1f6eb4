"""Every error leaves as JSON ``{"error": "<one line naming the field>", "request_id"}``.

Bad input is 4xx (413 over a limit, 422 malformed, 400 a feature not configured), never
5xx; only a genuine server fault is a 500, logged with its request id and traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ragsieve.errors import RagsieveError

log = logging.getLogger("ragsieve.serve")


class ServeError(Exception):
    """A client-side problem with a status code: over a limit (413), not configured (400), ..."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "")


def _json(request: Request, status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "request_id": request_id(request)}, status_code=status)


def _field(loc) -> str:
    # ("body", "documents", 3, "text") -> "documents.3.text"; a union branch name is noise
    parts = [str(p) for p in loc if p != "body" and not str(p).startswith(("function-", "tagged-union"))]
    return ".".join(parts) or "body"


def validation_message(exc: RequestValidationError) -> str:
    seen, parts = set(), []
    for err in exc.errors():
        text = f"{_field(err.get('loc', ()))}: {err.get('msg', 'invalid')}"
        if text not in seen:
            seen.add(text)
            parts.append(text)
    return "; ".join(parts[:5]) + (f"; ... ({len(parts) - 5} more)" if len(parts) > 5 else "")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError):
        return _json(request, exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _json(request, 422, validation_message(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return _json(request, exc.status_code, str(exc.detail))

    @app.exception_handler(RagsieveError)
    async def _ragsieve(request: Request, exc: RagsieveError):
        return _json(request, 422, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    @app.exception_handler(Exception)
    async def _fault(request: Request, exc: Exception):
        log.exception("rid=%s internal error", request_id(request))
        return _json(
            request, 500, f"internal error ({type(exc).__name__}); see the server log for rid={request_id(request)}"
        )
