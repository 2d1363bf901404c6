"""The HTTP server: aiohttp serving a :class:`~shardcast.layout.DataDir` as static files.

- Concurrent (asyncio): a slow or idle peer holds only its own connection.
- HTTP/1.1 keep-alive, ``Range`` requests (206) and ``sendfile`` through ``FileResponse``.
- Serves only paths matching :data:`~shardcast.layout.SERVED_PATH` (``index.json``,
  ``v<N>/manifest.json``, ``v<N>/shard_XXXXXX.bin``, ``v<N>/delta_XXXXXX.bin``); everything
  else, including ``.staging`` and directory listings, is 404.
- Optional bearer token for every request (``Authorization: Bearer <token>``), compared in
  constant time.
- Optional per-response rate limit (``rate_limit_bps``), e.g. to leave bandwidth to training
  traffic; it disables sendfile for the limited responses.

:class:`HttpServer` runs the app on a private event loop in a background thread, so it can
be embedded in synchronous programs (start/stop or ``with``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from .layout import INDEX_NAME, MANIFEST_NAME, SERVED_PATH, DataDir

log = logging.getLogger("shardcast.server")

_CHUNK = 1 << 20


def make_app(
    data_dir: DataDir, *, token: str | None = None, rate_limit_bps: float | None = None
) -> web.Application:
    """Build the aiohttp application serving ``data_dir`` (see module docstring)."""
    root = data_dir.root

    @web.middleware
    async def auth(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if token is not None:
            header = request.headers.get("Authorization", "")
            if not hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
                return web.Response(status=401, text="missing or wrong bearer token\n")
        return await handler(request)

    async def serve(request: web.Request) -> web.StreamResponse:
        rel = request.match_info["tail"]
        if not SERVED_PATH.fullmatch(rel):
            raise web.HTTPNotFound()
        path = root / rel
        try:
            # Refuse symlinks pointing outside the served directory.
            if not path.is_file() or not path.resolve().is_relative_to(root):
                raise web.HTTPNotFound()
        except OSError:
            raise web.HTTPNotFound() from None
        mutable = rel == INDEX_NAME or rel.endswith(MANIFEST_NAME)
        headers = {"Cache-Control": "no-cache" if mutable else "public, max-age=31536000, immutable"}
        if rate_limit_bps and not mutable and request.method == "GET":
            return await _throttled(request, path, rate_limit_bps, headers)
        return web.FileResponse(path, chunk_size=_CHUNK, headers=headers)

    app = web.Application(middlewares=[auth])
    app.router.add_route("GET", "/{tail:.*}", serve)
    return app


async def _throttled(
    request: web.Request, path: Path, rate_bps: float, headers: dict[str, str]
) -> web.StreamResponse:
    """Stream ``path`` (honouring a simple ``Range: bytes=a-`` / ``a-b``) at most ``rate_bps``."""
    size = path.stat().st_size
    start, end = 0, size
    status = 200
    rng = request.http_range
    if rng.start is not None or rng.stop is not None:
        start = rng.start or 0
        end = min(size, rng.stop) if rng.stop is not None else size
        if start < 0 or (start >= max(end, 1) and size > 0):
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
        status = 206
        headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = end - start
    response.content_type = "application/octet-stream"
    await response.prepare(request)
    step = max(1, min(_CHUNK, int(rate_bps / 10)))
    loop = asyncio.get_running_loop()
    with open(path, "rb") as handle:
        handle.seek(start)
        position = start
        while position < end:
            chunk = await loop.run_in_executor(None, handle.read, min(step, end - position))
            if not chunk:
                break
            await response.write(chunk)
            position += len(chunk)
            await asyncio.sleep(len(chunk) / rate_bps)
    await response.write_eof()
    return response


class HttpServer:
    """Run :func:`shardcast.server.make_app` on ``host:port`` in a background thread.

    ``port=0`` picks a free port; read ``.port`` / :attr:`url` after :meth:`start`.
    Default host is 127.0.0.1 (bind ``0.0.0.0`` explicitly to serve other machines).

    Raises:
        TypeError / ValueError: (at construction) ``port`` is not an int in 0..65535, or
            ``host`` is not a non-empty string.
        OSError: (from :meth:`start`) the address cannot be bound; the message names it.
    """

    def __init__(
        self,
        data_dir: DataDir,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        rate_limit_bps: float | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int in 0..65535 (0 = any free port), got {port!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = any free port), got {port}")
        if not isinstance(host, str) or not host:
            raise TypeError(f"host must be an address or name such as '127.0.0.1', got {host!r}")
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self._app = make_app(data_dir, token=token, rate_limit_bps=rate_limit_bps)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> HttpServer:
        loop = asyncio.new_event_loop()
        ready: list[BaseException | None] = []
        started = threading.Event()

        async def boot() -> None:
            self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, backlog=1024)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            if sockets:
                self.port = sockets[0].getsockname()[1]

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(boot())
                ready.append(None)
            except BaseException as exc:
                ready.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"shardcast-http-{self.port}", daemon=True)
        self._thread.start()
        started.wait()
        if ready and isinstance(ready[0], OSError):
            error = ready[0]
            reason = error.strerror or str(error)  # gaierror: "Name or service not known"
            raise OSError(error.errno, f"cannot listen on {self.host}:{self.port}: {reason}") from error
        if ready and ready[0] is not None:
            raise ready[0]
        log.info("serving %s on %s", self.data_dir.root, self.url)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = None
            self._thread = None

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
