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
    # a 503 is temporary (a reload, a shutdown): say when to retry
    headers = {"retry-after": "1"} if status == 503 else None
    return JSONResponse({"error": message, "request_id": request_id(request)}, status_code=status, headers=headers)


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})

#: pydantic's wording → the user's: what the value must be, in JSON terms
_PHRASES = (
    ("Input should be a valid dictionary or object to extract fields from", "must be a JSON object"),
    ("Input should be a valid dictionary", "must be a JSON object"),
    ("Input should be a valid list", "must be a JSON array"),
    ("Input should be a valid string", "must be a string"),
    ("Input should be a valid number, unable to parse string as a number", "must be a number"),
    ("Input should be a valid integer, unable to parse string as an integer", "must be an integer"),
    ("Input should be a valid integer", "must be an integer"),
    ("Input should be a valid number", "must be a number"),
    ("Input should be a valid boolean", "must be true or false"),
    ("Field required", "is required"),
    ("Extra inputs are not permitted", "is not a known field"),
    ("Input should be ", "must be "),
    ("String should have ", "must have "),
    ("List should have ", "must have "),
    ("Value error, ", ""),
    ("Assertion failed, ", ""),
)


def _is_branch(part) -> bool:
    """A union branch's name in an error location (``str``, ``DocumentIn``, ``list[function-after[...]]``):
    a library's type name, not a field the user sent."""
    if not isinstance(part, str):
        return False
    return part in _TYPE_NAMES or part[:1].isupper() or any(c in part for c in "[(-")


def _plain(message: str) -> str:
    for theirs, ours in _PHRASES:
        if message.startswith(theirs):
            return ours + message[len(theirs):]
    return message


def _errors(exc: RequestValidationError) -> list[tuple[tuple, str, str]]:
    """(union branches taken, field, rule) per error, of the branch each union's input matched best: a body
    sent as one feedback item is reported against the item, not also against the list it is not."""
    found = []
    for err in exc.errors():
        loc = [p for p in err.get("loc", ()) if p != "body"]
        branches = tuple((i, p) for i, p in enumerate(loc) if _is_branch(p))
        field = ".".join(str(p) for p in loc if not _is_branch(p)) or "body"
        found.append((branches, field, _plain(str(err.get("msg", "invalid")))))
    by_branch: dict[tuple, list] = {}
    for item in found:
        by_branch.setdefault(item[0], []).append(item)
    if len(by_branch) <= 1:
        return found
    # the branch whose errors lie deepest matched the input best
    depth = {b: max(0 if f == "body" else len(f.split(".")) for _, f, _ in items) for b, items in by_branch.items()}
    deepest = [b for b in by_branch if depth[b] == max(depth.values())]
    # on a tie, a branch that took the input's type and found a rule broken beats a type mismatch
    ruled = [b for b in deepest
             if any(not r.startswith("must be a JSON") and r != "is required" for _, _, r in by_branch[b])]
    if ruled:
        return by_branch[ruled[0]]
    fields = {f for b in deepest for _, f, _ in by_branch[b]}
    if len(fields) > 1:
        return by_branch[deepest[0]]
    # one field's types are alternatives ("must be a JSON object or a JSON array")
    rules = [r.removeprefix("must be ") for b in deepest for _, _, r in by_branch[b]]
    return [((), fields.pop(), "must be " + " or ".join(dict.fromkeys(rules)))]


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each bad field and its rule in the user's words (no library type names)."""
    seen, parts = set(), []
    for _, field, rule in _errors(exc):
        text = f"{field}: {rule}"
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
