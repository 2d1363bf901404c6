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
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Self

from aiohttp import web

from prime_rl.api.secrets import RunSecrets, SecretsError, check_bind_address, run_secrets
from prime_rl.config import RunConfig
from prime_rl.metrics import CallTimes, MetricsWriter, get_metrics, init_process
from prime_rl.orchestrator.admission import check_admission
from prime_rl.orchestrator.http import errors_middleware
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.routes import ROUTES, TRUSTED_ROUTES, ApiHandlers
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["API", "ROUTES", "OrchestratorServer", "TrustedListener", "build_app", "main"]

log = logging.getLogger(__name__)

RECORD_WAIT_S = 10.0  # at a stop, how long the record being written may take to finish (record_writer.py)
LAG_PROBE_S = 0.05  # the event loop's lag is sampled this often (metrics ``trusted_phases``, ``loop lag``)
API: web.AppKey[ApiHandlers] = web.AppKey("api", ApiHandlers)  # the handlers an app serves (``build_app``)


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
    app = _application(api, config, ROUTES)
    app[API] = api
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
        api.records.bind(asyncio.get_running_loop())  # the record is written on this loop, whoever commits
        tasks = [asyncio.create_task(loop()), asyncio.create_task(_lag_probe(api.calls.trusted_phases, "lag", pauses.drain))]
        yield
        with contextlib.suppress(TimeoutError):  # a record half written is redone at the next commit
            await asyncio.wait_for(api.records.idle(), RECORD_WAIT_S)
        api.records.close()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        gc.callbacks.remove(pauses)
        api.close()
        api.calls.trusted_phases.flush()  # the last window's (a short run has only a few)

    app.cleanup_ctx.append(expire_loop)
    app.cleanup_ctx.append(_tuned_collector(config.orchestrator.gc_young_threshold))
    return app


def _application(api: ApiHandlers, config: RunConfig, routes: dict[tuple[str, str], Any]) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=config.orchestrator.max_request_bytes)
    for (method, path), route in routes.items():
        app.router.add_route(method, path, getattr(api, route.handler))
    return app


async def _lag_probe(phases: CallTimes, name: str, drain: Callable[[CallTimes], None] | None = None) -> None:
    """How late an event loop runs what is ready (a request's first read too): ``trusted_phases``
    phase ``loop``, as ``name``; ``drain`` also records what was noted meanwhile (gc pauses)."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        phases.record("loop", name, 200, time.perf_counter() - began - LAG_PROBE_S)
        if drain is not None:
            drain(phases)


def _bound_port(site: web.TCPSite, configured: int) -> int:
    """The port ``site`` listens on (the one picked for a configured 0)."""
    sockets = getattr(getattr(site, "_server", None), "sockets", None) or []
    return sockets[0].getsockname()[1] if sockets else configured


class _LoopThread:
    """An event loop of its own, on a thread: ``start`` runs ``_open`` on it (what that raises,
    ``start`` raises), then serves until ``stop``, then runs ``_close``."""

    thread_name = "loop"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Start, once ``_open`` has run (what it raised is raised here, e.g. a port in use)."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"{self.thread_name} did not start within 30 s")
        if self._failed is not None:
            raise self._failed
        return self

    def stop(self) -> None:
        """Stop the loop, run ``_close``, and let the thread end."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop = None

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._open())
        except BaseException as error:  # handed to ``start``
            self._failed, self._loop = error, None
        else:
            self._ready.set()
            loop.run_forever()
        with contextlib.suppress(Exception):
            loop.run_until_complete(self._close())
        loop.close()
        self._ready.set()


class TrustedListener(_LoopThread):
    """The trusted roles' own listener (``orchestrator.trusted_port``): ``TRUSTED_ROUTES``, served by
    the server's own handlers (``build_app``'s ``app[API]``), on a thread and an event loop of its own.

    Why: every request is read and answered on an event loop, and with one loop the validator's and
    trainer's requests waited for it behind the swarm's. At 1,024 identities sharing two cores its
    lag reached 497-537 ms, and it was what was left of their latency once the ledger thread took
    their calls first (``priority.py``; ``benchmarks/results/swarm.md``). On a loop of their own,
    their requests wait only for the GIL (the main loop hands it over at each system call, or after
    ``sys.getswitchinterval``) and for the ledger thread, which takes them first. Their ledger calls,
    durability (``group_commit.py``: the same fsyncs) and record writing (``record_writer.py``: on
    the server's loop) are the server's. Its loop's lag is logged as ``trusted_phases`` ``loop
    trusted lag``. ``start`` raises what binding raised (e.g. the port in use); ``port`` is the
    port it listens on."""

    thread_name = "orchestrator-trusted"

    def __init__(self, api: ApiHandlers, config: RunConfig) -> None:
        super().__init__()
        self._api, self._orchestrator = api, config.orchestrator
        self._runner = web.AppRunner(_application(api, config, TRUSTED_ROUTES), access_log=None, shutdown_timeout=2.0)
        self._lag: asyncio.Task[None] | None = None
        self.port = 0

    @classmethod
    def of(cls, runner: web.AppRunner, config: RunConfig) -> TrustedListener | None:
        """The started listener of ``runner``'s app (set up by ``build_app``), or None when
        ``orchestrator.trusted_port`` is null."""
        return cls(runner.app[API], config).start() if config.orchestrator.trusted_port is not None else None

    async def _open(self) -> None:
        orchestrator = self._orchestrator
        await self._runner.setup()
        site = web.TCPSite(self._runner, orchestrator.trusted_host or orchestrator.host, orchestrator.trusted_port)
        await site.start()
        self.port = _bound_port(site, orchestrator.trusted_port or 0)
        self._lag = asyncio.create_task(_lag_probe(self._api.calls.trusted_phases, "trusted lag"))

    async def _close(self) -> None:
        """Stop listening; requests in flight get ``shutdown_timeout`` to finish."""
        if self._lag is not None:
            self._lag.cancel()
        await self._runner.cleanup()


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


class _YoungThreshold:
    """The interpreter's first garbage-collection threshold, raised while any orchestrator app in
    this process serves (``orchestrator.gc_young_threshold``). At the default 700 a new collection
    starts whenever 700 more container objects exist than at the last one: a claim or a validator's
    listing builds hundreds of samples at once, each with its token lists, so a closed loop of 256
    identities collected about 30 times a second, moving in-flight requests into the older
    generations, whose collections then walked them again. A larger threshold makes collections
    rarer but longer (``benchmarks/results/closed_loop.md``, runs 16-18). Process-wide, so the apps
    of one process (tests start many) share it: the largest asked for holds while any serves, and
    the interpreter's own comes back when the last stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[int] = []
        self._before: tuple[int, ...] = ()

    @contextlib.contextmanager
    def held(self, threshold: int) -> Iterator[None]:
        if threshold <= 0:
            yield
            return
        with self._lock:
            if not self._held:
                self._before = gc.get_threshold()
            self._held.append(threshold)
            gc.set_threshold(max(self._held), *self._before[1:])
        try:
            yield
        finally:
            with self._lock:
                self._held.remove(threshold)
                gc.set_threshold(max(self._held, default=self._before[0]), *self._before[1:])


_YOUNG_THRESHOLD = _YoungThreshold()


def _tuned_collector(young_threshold: int) -> Callable[[web.Application], AsyncIterator[None]]:
    """The app's cleanup context for the garbage collector: ``gc.freeze`` once the ledger is loaded,
    and the young generation's threshold (``_YoungThreshold``) while it serves."""

    async def tuned(app: web.Application) -> AsyncIterator[None]:
        """Take every object alive once the ledger is loaded (modules, the replayed workers, leases
        and batches: some 77,000 at 10,000 workers) out of the garbage collector's walks
        (``gc.freeze``). A full collection otherwise walks them all while it holds the GIL, stalling
        every request for its whole length (how long, and how often under anonymous readers:
        ``benchmarks/results/anonymous_reads_gc.md``). Frozen objects are still freed by reference
        counting; only reference cycles among them wait for the unfreeze when the app stops (which
        frees the cycles of an embedded server: tests start hundreds in one process)."""
        gc.collect()
        gc.freeze()
        with _YOUNG_THRESHOLD.held(young_threshold):
            yield
        gc.unfreeze()

    return tuned


class OrchestratorServer(_LoopThread):
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
        super().__init__()
        _check_bind_addresses(config)
        check_admission(config.orchestrator)
        self.config = config
        self.registration_clock = registration_clock
        self.trusted: RunSecrets = run_secrets(config)
        self.store = RolloutStore(config.orchestrator_data_dir)
        self.ledger = Ledger(config, tasks, self.store, metrics=metrics, secrets=self.trusted, clock=clock)
        self._runner: web.AppRunner | None = None
        self._listener: TrustedListener | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def trusted_url(self) -> str:
        """The trusted listener's URL (``orchestrator.trusted_port``), else ``url``."""
        return f"http://127.0.0.1:{self._listener.port}" if self._listener is not None else self.url

    @property
    def admin_token(self) -> str:
        return self.trusted.admin_token

    thread_name = "orchestrator"

    async def _open(self) -> None:
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
        self._listener = TrustedListener.of(self._runner, self.config)
        site = web.TCPSite(self._runner, self.config.orchestrator.host, self.config.orchestrator.port)
        await site.start()
        self.port = _bound_port(site, self.config.orchestrator.port)

    async def _close(self) -> None:
        if self._listener is not None:  # first: its requests in flight still need the ledger thread
            self._listener.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> OrchestratorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_bind_addresses(config: RunConfig) -> None:
    """``check_bind_address`` for the main port, and for the trusted listener's when it has one."""
    orchestrator = config.orchestrator
    check_bind_address(orchestrator.host, orchestrator.admin_token)
    if orchestrator.trusted_port is not None:
        check_bind_address(orchestrator.trusted_host or orchestrator.host, orchestrator.admin_token)


async def _serve(config: RunConfig, tasks: Any, trusted: RunSecrets) -> None:
    store = RolloutStore(config.orchestrator_data_dir)
    ledger = Ledger(config, tasks, store, metrics=get_metrics(), secrets=trusted)
    app = build_app(ledger, config, admin_token=trusted.admin_token)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await _serve_app(config, runner, store, ledger)
    finally:
        await runner.cleanup()


async def _serve_app(config: RunConfig, runner: web.AppRunner, store: RolloutStore, ledger: Ledger) -> None:
    # The trusted roles' listener first: they are started once the main port answers.
    listener = TrustedListener.of(runner, config)
    try:
        site = web.TCPSite(runner, config.orchestrator.host, config.orchestrator.port)
        # Handlers first: whoever reads "serving" below may stop us at once, and must get a clean stop.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await site.start()
        trusted_port = listener.port if listener is not None else None
        log.info(
            "orchestrator serving on %s (trusted listener: %s; data %s, step %d, %d batches stored, %d workers)",
            config.orchestrator.url, f"port {trusted_port}" if listener else "none", store.root, ledger.step,
            len(ledger.batches), len(ledger.workers),
        )  # fmt: skip
        get_metrics().log(
            "serving", url=config.orchestrator.url, trusted_port=trusted_port, step=ledger.step, batches=len(ledger.batches)
        )
        await stop.wait()
        log.info("orchestrator shutting down")
    finally:
        if listener is not None:
            listener.stop()


def main(config: RunConfig, name: str = "orchestrator") -> int:
    """Entry point of ``prime-rl orchestrator``: serve until SIGINT/SIGTERM."""
    from prime_rl.tasks import load_tasks

    init_process("orchestrator", name, config.run_dir)
    try:
        _check_bind_addresses(config)
        check_admission(config.orchestrator)
        trusted = run_secrets(config)
    except SecretsError as error:
        log.error("refusing to start: %s", error)
        return 2
    tasks = load_tasks(config.tasks)
    asyncio.run(_serve(config, tasks, trusted))
    return 0
