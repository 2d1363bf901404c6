"""The orchestrator process: an aiohttp JSON service over a ``Ledger`` (the API is in API.md).

The route table and the handlers, with how a request is read, checked and handed to the ledger,
are routes.py's (``ROUTES`` is re-exported here); this module builds the application around them
(``build_app``: the handlers, the error middleware, a background task that expires leases every
second, probes of the event loop's lag and of garbage-collection pauses, the frozen heap), and runs
it: as a process (``main``, ``prime-rl orchestrator --config FILE``) or embedded in a thread
(``OrchestratorServer``, tests do).

Bound to a non-loopback address, the orchestrator refuses to start unless the admin token is
configured (``orchestrator.admin_token``; else the one generated for the run in
``<run_dir>/secrets/run.json``, ``api/secrets.py``, which only the trusted processes on this machine
read) and one registration admission rule is configured or ``orchestrator.open_registration`` is
set (admission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from prime_rl.api.secrets import RunSecrets, SecretsError, check_bind_address, run_secrets
from prime_rl.config import RunConfig
from prime_rl.metrics import CallTimes, MetricsWriter, get_metrics, init_process
from prime_rl.orchestrator.admission import check_admission
from prime_rl.orchestrator.http import errors_middleware
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.routes import ROUTES, ApiHandlers
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["ROUTES", "OrchestratorServer", "build_app", "main"]

log = logging.getLogger(__name__)

RECORD_WAIT_S = 10.0  # at a stop, how long the record being written may take to finish (record_writer.py)
LAG_PROBE_S = 0.05  # the event loop's lag is sampled this often (metrics ``trusted_phases``, ``loop lag``)


def build_app(
    ledger: Ledger,
    config: RunConfig,
    *,
    admin_token: str,
    registration_clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """The aiohttp application serving ``ledger`` (with the lease-expiry background task).

    ``admin_token``: the bearer token of the trusted endpoints (non-empty; ``run_secrets``).
    ``registration_clock``: monotonic seconds for the registration rate limit (tests inject one).
    """
    api = ApiHandlers(ledger, config, admin_token, registration_clock)
    app = web.Application(middlewares=[errors_middleware], client_max_size=config.orchestrator.max_request_bytes)
    for (method, path), route in ROUTES.items():
        app.router.add_route(method, path, getattr(api, route.handler))
    interval = min(1.0, config.orchestrator.task_timeout_s / 4)

    async def expire_loop(app: web.Application) -> Any:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await api.call(ledger.expire_leases, trusted=True)
                except Exception:  # a full disk must not kill the loop; the next tick retries
                    log.exception("lease expiry failed")

        pauses = _GcPauses()
        gc.callbacks.append(pauses)

        async def lag() -> None:  # how late the event loop runs what is ready (a request's first read too)
            phases = api.calls.trusted_phases
            while True:
                began = time.perf_counter()
                await asyncio.sleep(LAG_PROBE_S)
                phases.record("loop", "lag", 200, time.perf_counter() - began - LAG_PROBE_S)
                pauses.drain(phases)

        tasks = [asyncio.create_task(loop()), asyncio.create_task(lag())]
        yield
        with contextlib.suppress(TimeoutError):  # a record half written is redone at the next commit
            await asyncio.wait_for(api.records.idle(), RECORD_WAIT_S)
        api.records.close()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        gc.callbacks.remove(pauses)
        api.calls.close()

    app.cleanup_ctx.append(expire_loop)
    app.cleanup_ctx.append(_freeze_loaded_heap)
    return app


class _GcPauses:
    """A ``gc.callbacks`` entry noting how long each collection stopped the process (the GIL is held
    throughout), per generation: a stall of every request that the event loop's lag alone would not
    explain. ``drain`` records them as ``trusted_phases`` phase ``gc``. The callback itself only
    appends to a deque: a collection may start inside ``CallTimes.record``, under its lock."""

    def __init__(self) -> None:
        self._began = 0.0
        self._pauses: deque[tuple[int, float]] = deque(maxlen=10_000)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self._pauses.append((info["generation"], time.perf_counter() - self._began))

    def drain(self, times: CallTimes) -> None:
        while self._pauses:
            generation, seconds = self._pauses.popleft()
            times.record("gc", f"gen{generation}", 200, seconds)


async def _freeze_loaded_heap(app: web.Application) -> AsyncIterator[None]:
    """Take every object alive once the ledger is loaded (modules, the replayed workers, leases and
    batches: some 77,000 at 10,000 workers) out of the garbage collector's walks (``gc.freeze``).
    A full collection otherwise walks them all while it holds the GIL, stalling every request for
    its whole length (how long, and how often under anonymous readers:
    ``benchmarks/results/anonymous_reads_gc.md``). Frozen objects are still freed by reference
    counting; only reference cycles among them wait for the unfreeze when the app stops (which frees
    the cycles of an embedded server: tests start hundreds in one process)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


class OrchestratorServer:
    """Run the orchestrator in a background thread (for tests and embedding).

    ``with OrchestratorServer(config, tasks) as server: server.url``; port 0 picks a free port.
    ``registration_clock`` drives the registration rate limit (default ``time.monotonic``), ``clock``
    the ledger's lease deadlines (default ``time.time``; tests step both by hand);
    ``server.admin_token`` is the token of the trusted endpoints (``run_secrets(config)``).
    """

    def __init__(
        self,
        config: RunConfig,
        tasks: Any,
        *,
        metrics: MetricsWriter | None = None,
        registration_clock: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_bind_address(config.orchestrator.host, config.orchestrator.admin_token)
        check_admission(config.orchestrator)
        self.config = config
        self.registration_clock = registration_clock
        self.trusted: RunSecrets = run_secrets(config)
        self.store = RolloutStore(config.orchestrator_data_dir)
        self.ledger = Ledger(config, tasks, self.store, metrics=metrics, secrets=self.trusted, clock=clock)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        return self.trusted.admin_token

    def start(self) -> OrchestratorServer:
        self._thread = threading.Thread(target=self._run, name="orchestrator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("orchestrator did not start within 30 s")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(
            build_app(
                self.ledger,
                self.config,
                admin_token=self.trusted.admin_token,
                registration_clock=self.registration_clock,
            ),
            access_log=None,
            shutdown_timeout=2.0,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.orchestrator.host, self.config.orchestrator.port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.config.orchestrator.port

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop = None

    def __enter__(self) -> OrchestratorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _serve(config: RunConfig, tasks: Any, trusted: RunSecrets) -> None:
    store = RolloutStore(config.orchestrator_data_dir)
    ledger = Ledger(config, tasks, store, metrics=get_metrics(), secrets=trusted)
    app = build_app(ledger, config, admin_token=trusted.admin_token)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, config.orchestrator.host, config.orchestrator.port)
    # Handlers first: whoever reads "serving" below may stop us at once, and must get a clean stop.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await site.start()
    log.info(
        "orchestrator serving on %s (data %s, step %d, %d batches stored, %d workers)",
        config.orchestrator.url, store.root, ledger.step, len(ledger.batches), len(ledger.workers),
    )  # fmt: skip
    get_metrics().log("serving", url=config.orchestrator.url, step=ledger.step, batches=len(ledger.batches))
    await stop.wait()
    log.info("orchestrator shutting down")
    await runner.cleanup()


def main(config: RunConfig, name: str = "orchestrator") -> int:
    """Entry point of ``prime-rl orchestrator``: serve until SIGINT/SIGTERM."""
    from prime_rl.tasks import load_tasks

    init_process("orchestrator", name, config.run_dir)
    try:
        check_bind_address(config.orchestrator.host, config.orchestrator.admin_token)
        check_admission(config.orchestrator)
        trusted = run_secrets(config)
    except SecretsError as error:
        log.error("refusing to start: %s", error)
        return 2
    tasks = load_tasks(config.tasks)
    asyncio.run(_serve(config, tasks, trusted))
    return 0
