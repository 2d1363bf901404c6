"""HTTP plumbing of the orchestrator's service: error answers, body/query parsing, bearer tokens.

Every refused request becomes ``{"error": code, "message": text}`` with its status (API.md's
table); ``errors_middleware`` turns ``ApiFailure`` and aiohttp's own errors into that shape and
any unexpected exception into a logged 500, so the service never dies on a request.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from prime_rl.api.errors import ApiFailure
from prime_rl.orchestrator.store import StoreError

__all__ = [
    "MAX_QUERY_INT",
    "Handler",
    "bearer",
    "client_gone",
    "error_response",
    "errors_middleware",
    "in_line",
    "model_response",
    "query_int",
    "refuse_if_gone",
    "require_token",
    "validation_message",
]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_QUERY_INT = 2**62


def error_response(status: int, error: str, message: str, retry_after_s: float | None = None) -> web.Response:
    headers = None
    if status in (429, 503):  # Retry-After is whole seconds (RFC 9110); never 0, which invites a spin
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_s or 1.0)))}
    return web.json_response({"error": error, "message": message}, status=status, headers=headers)


def model_response(model: BaseModel) -> web.Response:
    return web.Response(body=model.model_dump_json().encode(), content_type="application/json")


def validation_message(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"]) or "<body>"
        parts.append(f"{location}: {item['msg']}")
    more = error.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more errors" if more > 0 else "")


def query_int(request: web.Request, name: str, *, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_QUERY_INT:
        raise ApiFailure(400, "bad_request", f"query parameter {name} must be a non-negative integer")
    return int(raw)


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.startswith("Bearer ") else ""


def client_gone(request: web.Request) -> bool:
    """Whether the client closed the request's connection (it gave up waiting for the answer): an
    answer written now would reach no one."""
    transport = request.transport
    return transport is None or transport.is_closing()


def refuse_if_gone(request: web.Request) -> None:
    """ApiFailure 408 ``client_gone`` when the client has closed the connection (``client_gone``)."""
    if client_gone(request):
        raise ApiFailure(408, "client_gone", "the client closed the connection before its answer was ready")


@contextlib.contextmanager
def in_line(counts: dict[Hashable, int], members: set[Any], key: Hashable) -> Iterator[None]:
    """``key`` is in ``members`` while at least one request holding it waits or runs (``counts``
    per key): e.g. a lease whose batch waits for the lock (``LeaseBook.answering``)."""
    counts[key] = counts.get(key, 0) + 1
    members.add(key)
    try:
        yield
    finally:
        counts[key] -= 1
        if not counts[key]:
            del counts[key]
            members.discard(key)


def require_token(request: web.Request, expected: str, what: str) -> None:
    """ApiFailure 401 unless ``expected`` is empty or the request carries it as its bearer token."""
    if expected and not secrets.compare_digest(bearer(request).encode(), expected.encode()):
        raise ApiFailure(401, "unauthorized", f"this endpoint needs the {what} (Authorization: Bearer ...)")


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiFailure as failure:
        return error_response(failure.status, failure.error, failure.message, failure.retry_after_s)
    except web.HTTPRequestEntityTooLarge as error:
        return error_response(413, "too_large", f"request body over the limit: {error.text}")
    except web.HTTPNotFound:
        return error_response(404, "not_found", f"no endpoint {request.method} {request.path}")
    except web.HTTPMethodNotAllowed:
        return error_response(405, "method_not_allowed", f"{request.method} is not allowed on {request.path}")
    except web.HTTPException as error:
        return error_response(error.status, "bad_request" if error.status < 500 else "internal", error.reason or "")
    except ConnectionResetError:
        log.info("client went away during %s %s", request.method, request.path)
        return error_response(400, "bad_request", "connection lost while reading the request")
    except StoreError as error:
        log.error("store failure on %s %s: %s", request.method, request.path, error)
        return error_response(503, "unavailable", f"could not persist the request: {error}")
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error (logged); the request may be retried")
