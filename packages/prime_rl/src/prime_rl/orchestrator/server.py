"""The orchestrator process: an aiohttp JSON service over a ``Ledger`` (the API is in API.md).

Request handling: the body is read with a size cap, validated with the endpoint's pydantic model
(strict; 400 with the first errors on failure), authenticated, then handed to the ledger under
one lock in a worker thread (the ledger fsyncs, which must not stall the event loop). Any
``ApiFailure`` becomes its JSON error; any other exception becomes a logged 500; the service
never dies on a request. A background task expires leases every second.

Registration is open to untrusted clients, so ``POST /workers/register`` is rate limited per
client address (token buckets of rate_limit.py: ``orchestrator.register_rate_per_minute`` and
``register_burst``; 429 ``rate_limited`` with ``Retry-After``), needs
``orchestrator.registration_token`` when one is set (401 otherwise), must pass the configured
allow-list and hook (admission.py; 403 ``forbidden``), and the ledger caps the unbanned workers at
``orchestrator.max_workers`` (503 ``worker_limit``). Bound to a non-loopback address, the
orchestrator refuses to start unless one admission rule is configured or
``orchestrator.open_registration`` is set.

Every trusted endpoint (``/validator/*``, ``/trainer/*``, ``POST /workers/ban``) requires the
run's admin token, always: the configured ``orchestrator.admin_token``, else the one generated for
the run in ``<run_dir>/secrets/run.json`` (``api/secrets.py``), which only the trusted processes on
this machine read. Bound to a non-loopback address, the orchestrator refuses to start unless the
token is configured.

Run it with ``prime-rl orchestrator --config FILE`` or embed ``OrchestratorServer`` (tests do).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from prime_rl.api.protocol import (
    BanRequest,
    ClaimRequest,
    CommitRequest,
    DoneRequest,
    NoiseProfileAnswer,
    NoiseProfileRecord,
    RegisterRequest,
    RolloutBatch,
    SwitchRequest,
    ValidatorLeaseRequest,
    VerdictRequest,
)
from prime_rl.api.secrets import RunSecrets, SecretsError, check_bind_address, run_secrets
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter, get_metrics, init_process
from prime_rl.orchestrator.admission import check_admission, load_admission
from prime_rl.orchestrator.delivery import LeaseAsk, LedgerCalls
from prime_rl.orchestrator.http import (
    bearer,
    errors_middleware,
    model_response,
    query_int,
    require_token,
    validation_message,
)
from prime_rl.orchestrator.ledger import ApiFailure, Ledger
from prime_rl.orchestrator.noise_profile import RunNoiseProfile
from prime_rl.orchestrator.rate_limit import TokenBuckets, network_key
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.workers_view import WorkersView

__all__ = ["ROUTES", "OrchestratorServer", "build_app", "main"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

@dataclass(frozen=True)
class Route:
    """One endpoint: the ``_Api`` method that handles it and its request body model (None: no body)."""

    handler: str
    body: type[BaseModel] | None = None


ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/health"): Route("health"),
    ("GET", "/status"): Route("status"),
    ("POST", "/workers/register"): Route("register", RegisterRequest),
    ("GET", "/tasks"): Route("tasks"),
    ("POST", "/leases/switch"): Route("switch", SwitchRequest),
    ("POST", "/leases/done"): Route("done", DoneRequest),
    ("POST", "/rollouts"): Route("rollouts", RolloutBatch),
    ("GET", "/rollouts/verdicts"): Route("batch_verdicts"),
    ("GET", "/workers"): Route("workers"),
    ("POST", "/workers/ban"): Route("ban", BanRequest),
    ("GET", "/validator/pending"): Route("pending"),
    ("POST", "/validator/leases"): Route("validator_leases", ValidatorLeaseRequest),
    ("POST", "/validator/verdicts"): Route("verdicts", VerdictRequest),
    ("GET", "/validator/noise-profile"): Route("noise_profile"),
    ("POST", "/validator/noise-profile/publish"): Route("publish_noise_profile", NoiseProfileRecord),
    ("POST", "/trainer/claim"): Route("claim", ClaimRequest),
    ("POST", "/trainer/commit"): Route("commit", CommitRequest),
}
"""The one route table: every endpoint, its handler and body model. API.md documents exactly these."""

CAPABILITIES = ("noise_profile", "validator_leases")
"""Optional features announced in ``GET /status`` (``StatusResponse.capabilities``)."""

class _Api:
    def __init__(
        self, ledger: Ledger, config: RunConfig, admin_token: str, registration_clock: Callable[[], float]
    ) -> None:
        orch = config.orchestrator
        if not admin_token:
            raise ValueError("the trusted endpoints need an admin token (see prime_rl.api.secrets)")
        self.ledger = ledger
        self.admin_token = admin_token
        self.registration_token = orch.registration_token
        self.admission = load_admission(orch)
        # Only touched on the event loop thread (no await between check and spend): needs no lock.
        self.registrations = TokenBuckets(
            orch.register_rate_per_minute, orch.register_burst, clock=registration_clock
        )
        self.calls = LedgerCalls(ledger)  # the lock (trusted first), group commit, delivery (delivery.py)
        self.call = self.calls.call
        self.workers_view = WorkersView(ledger, orch.workers_view_max_age_s)
        self.noise_profiles = RunNoiseProfile(config.orchestrator_data_dir)

    async def body(self, request: web.Request, model: type[M]) -> M:
        raw = await request.read()  # aiohttp enforces client_max_size (413) before this returns
        try:
            return model.model_validate_json(raw)
        except ValidationError as error:
            raise ApiFailure(400, "bad_request", validation_message(error)) from None

    def require_admin(self, request: web.Request) -> None:
        require_token(request, self.admin_token, "admin token")

    def admit_registration(self, request: web.Request) -> None:
        """ApiFailure 429 ``rate_limited`` when the client's network (IPv4 /24, IPv6 /64) is over its
        registration rate."""
        key = network_key(request.remote)
        admission = self.registrations.admit(key)
        if not admission.allowed:
            log.debug("registration from %s rate limited", key)
            raise ApiFailure(
                429,
                "rate_limited",
                f"too many registrations from {key} (orchestrator.register_rate_per_minute); "
                f"retry in {admission.retry_after_s:.1f} s",
                retry_after_s=admission.retry_after_s,
            )

    # -------------------------------------------------------------- handlers

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def status(self, request: web.Request) -> web.Response:
        # Anonymous and polled by every worker: answered on the event loop without the ledger's lock
        # (Ledger.status reads a few counters, each read atomic), so it never queues behind a
        # lease, a batch or a verdict, and a flood of it never delays them.
        return model_response(self.ledger.status().model_copy(update={"capabilities": list(CAPABILITIES)}))

    async def register(self, request: web.Request) -> web.Response:
        self.admit_registration(request)  # first: wrong tokens and bad bodies count against the rate too
        require_token(request, self.registration_token, "registration token")
        body = await self.body(request, RegisterRequest)
        # Off the ledger's lock: a hook may take time (a stake lookup) and must not stall other requests.
        await asyncio.to_thread(self.admission.admit, body.name, request.remote or "", dict(request.headers))
        return model_response(await self.call(self.ledger.register, body.name, network_key(request.remote)))

    async def tasks(self, request: web.Request) -> web.Response:
        worker_id = request.query.get("worker_id", "")
        if not worker_id:
            raise ApiFailure(400, "bad_request", "query parameter worker_id is required")
        step = query_int(request, "step")
        batch_index = query_int(request, "batch_index")
        version = query_int(request, "version")
        resume = bool(query_int(request, "resume", default=0))
        # Issue 44: a client that left gets no lease, or has it withdrawn uncharged (delivery.py).
        ask = LeaseAsk(worker_id, step, batch_index, version, resume)
        return model_response(await self.calls.lease(request, ask))

    async def switch(self, request: web.Request) -> web.Response:
        body = await self.body(request, SwitchRequest)

        def work() -> Any:
            worker = self.ledger.authenticate(body.worker_id, bearer(request))
            return self.ledger.switch(worker, body)

        return model_response(await self.call(work))

    async def done(self, request: web.Request) -> web.Response:
        body = await self.body(request, DoneRequest)

        def work() -> Any:
            worker = self.ledger.authenticate(body.worker_id, bearer(request))
            return self.ledger.done(worker, body)

        return model_response(await self.call(work))

    async def rollouts(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            batch = RolloutBatch.model_validate_json(raw)
        except ValidationError as error:
            await self._count_malformed(raw)
            raise ApiFailure(400, "bad_request", validation_message(error)) from None

        # While this batch waits for the lock and its payload is written, its lease does not expire:
        # the wait is the server's.
        with self.calls.waiting((batch.worker_id, batch.batch_index)):
            digest, token = hashlib.sha256(raw).hexdigest(), bearer(request)
            await self.call(self.ledger.authenticate, batch.worker_id, token)
            try:
                rows = self.ledger.batches.check(batch)  # 413/400 before anything is written
            except ApiFailure:
                await self.call(self.ledger.record_malformed, batch.worker_id)
                raise
            # The payload is written and fsynced outside the lock (group_commit.py), then indexed under it.
            batch_id = f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}"
            path = await asyncio.to_thread(self.ledger.store.write_payload, batch_id, digest, rows)

            def work() -> Any:
                stored = False
                try:
                    worker = self.ledger.authenticate(batch.worker_id, token)
                    try:
                        answer = self.ledger.submit(worker, batch, digest, payload=path)
                    except ApiFailure:
                        self.ledger.record_malformed(worker.worker_id)
                        raise
                    stored = not answer.duplicate
                    return answer
                finally:
                    if not stored:  # a duplicate or a refusal: no row refers to this request's payload
                        path.unlink(missing_ok=True)

            return model_response(await self.call(work))

    async def batch_verdicts(self, request: web.Request) -> web.Response:
        worker_id = request.query.get("worker_id", "")
        batch_id = request.query.get("batch_id", "")
        if not worker_id or not batch_id:
            raise ApiFailure(400, "bad_request", "query parameters worker_id and batch_id are required")

        def work() -> Any:
            worker = self.ledger.authenticate(worker_id, bearer(request))
            return self.ledger.batch_verdicts(worker, batch_id)

        return model_response(await self.call(work))

    async def _count_malformed(self, raw: bytes) -> None:
        """Attribute a malformed body to its worker when it names a registered one (best effort)."""
        import json

        try:
            worker_id = json.loads(raw).get("worker_id")
        except (ValueError, AttributeError, RecursionError):
            return
        if isinstance(worker_id, str) and worker_id in self.ledger.workers:
            await self.call(self.ledger.record_malformed, worker_id)

    async def workers(self, request: web.Request) -> web.Response:
        # Anonymous: a page of a cached snapshot, never the ledger's lock (workers_view.py).
        return web.Response(body=await self.workers_view.page(dict(request.query)), content_type="application/json")

    async def ban(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, BanRequest)
        return model_response(await self.call(self.ledger.ban, body, trusted=True))

    async def pending(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        limit = query_int(request, "limit", default=8)
        if limit is None or not 1 <= limit <= 256:
            raise ApiFailure(400, "bad_request", "limit must be in 1..256")
        return model_response(await self.call(self.ledger.pending, limit, trusted=True))

    async def validator_leases(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, ValidatorLeaseRequest)
        return model_response(await self.call(self.ledger.take_batches, body, trusted=True))

    async def verdicts(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, VerdictRequest)
        return model_response(await self.call(self.ledger.record_verdicts, body, trusted=True))

    async def noise_profile(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        return model_response(NoiseProfileAnswer(record=await asyncio.to_thread(self.noise_profiles.get)))

    async def publish_noise_profile(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, NoiseProfileRecord)
        return model_response(NoiseProfileAnswer(record=await asyncio.to_thread(self.noise_profiles.publish, body)))

    async def claim(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, ClaimRequest)
        return model_response(await self.call(self.ledger.claim, body, trusted=True))

    async def commit(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.body(request, CommitRequest)
        return model_response(await self.call(self.ledger.commit, body, trusted=True))


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
    api = _Api(ledger, config, admin_token, registration_clock)
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

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        api.calls.close()

    app.cleanup_ctx.append(expire_loop)
    app.cleanup_ctx.append(_freeze_loaded_heap)
    return app


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
