"""The orchestrator's HTTP endpoints: the one route table and the handler of each route, by caller.

Request handling: the body is read with a size cap, validated with the endpoint's pydantic model
(strict; 400 with the first errors on failure), authenticated, then handed to the ledger under
one lock in a worker thread (the ledger fsyncs, which must not stall the event loop; the lock,
group commit and delivery are delivery.py's). Any ``ApiFailure`` becomes its JSON error; any other
exception becomes a logged 500 (http.py's middleware); the service never dies on a request.

Registration is open to untrusted clients, so ``POST /workers/register`` is rate limited per
client address (token buckets of rate_limit.py: ``orchestrator.register_rate_per_minute`` and
``register_burst``; 429 ``rate_limited`` with ``Retry-After``), needs
``orchestrator.registration_token`` when one is set (401 otherwise), must pass the configured
allow-list and hook (admission.py; 403 ``forbidden``), and the ledger caps the unbanned workers at
``orchestrator.max_workers`` (503 ``worker_limit``).

Every trusted endpoint (``/validator/*``, ``/trainer/*``, ``POST /workers/ban``) requires the
run's admin token, always (``api/secrets.py``). The application around these handlers (the
lease-expiry task, the process, the embeddable server) is server.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from prime_rl.api.fields import printable
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
from prime_rl.config import RunConfig
from prime_rl.orchestrator.admission import load_admission
from prime_rl.orchestrator.batch_verdicts import Listing, UnreadSamples
from prime_rl.orchestrator.delivery import LeaseAsk, LedgerCalls
from prime_rl.orchestrator.http import (
    bearer,
    model_response,
    query_int,
    require_token,
    validation_message,
)
from prime_rl.orchestrator.ledger import ApiFailure, Ledger
from prime_rl.orchestrator.noise_profile import RunNoiseProfile
from prime_rl.orchestrator.rate_limit import TokenBuckets, network_key
from prime_rl.orchestrator.record_writer import RecordWriter
from prime_rl.orchestrator.workers_view import WorkersView

__all__ = ["CAPABILITIES", "ROUTES", "TRUSTED_ROUTES", "ApiHandlers", "Route"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Route:
    """One endpoint: the ``ApiHandlers`` method that handles it and its request body model (None: no body)."""

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

TRUSTED_ROUTES: dict[tuple[str, str], Route] = {
    key: route for key, route in ROUTES.items()
    if key[1].startswith(("/validator/", "/trainer/")) or key in {("POST", "/workers/ban"), ("GET", "/status"), ("GET", "/health")}
}  # fmt: skip
"""What the trusted listener serves (``orchestrator.trusted_port``, server.py): the admin-token endpoints,
and ``/status`` and ``/health`` that the trusted roles read too."""

CAPABILITIES = ("noise_profile", "validator_leases", "packed_arrays")
"""Optional features announced in ``GET /status`` (``StatusResponse.capabilities``)."""


def packed_arrays(request: web.Request) -> bool:
    """A listing's query ``arrays``: ``packed`` (the samples' token and log-prob lists in their packed
    form, ``api.fields.packed_array``) or ``json`` (JSON lists, the default); 400 otherwise."""
    arrays = request.query.get("arrays", "json")
    if arrays not in ("json", "packed"):
        raise ApiFailure(400, "bad_request", f"query parameter arrays must be 'json' or 'packed', got {printable(arrays)!r}")
    return arrays == "packed"


class ApiHandlers:
    """The handler of every route in ``ROUTES`` (by method name), over one ``Ledger``."""

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
        self.records = RecordWriter(self.calls)  # the training record, written outside the lock (record_writer.py)
        self.workers_view = WorkersView(ledger, orch.workers_view_max_age_s)
        # The validators' listings read their samples here: threads of their own, so a trusted call never
        # waits for asyncio's shared pool, which a swarm's payload writes can keep busy.
        self.listings = ThreadPoolExecutor(max_workers=2, thread_name_prefix="listing")
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
                        self.ledger.store.payloads.delete([path])

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
        packed = packed_arrays(request)
        answer, unread = await self.call(self.ledger.pending_unread, limit, trusted=True)
        return await self._with_samples(answer, unread, packed)

    async def validator_leases(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        packed = packed_arrays(request)
        body = await self.body(request, ValidatorLeaseRequest)
        answer, unread = await self.call(self.ledger.take_batches_unread, body, trusted=True)
        return await self._with_samples(answer, unread, packed)

    async def _with_samples(self, answer: Listing, unread: UnreadSamples, packed: bool) -> web.Response:
        """A validator's listing with its samples, read and serialized on a thread of ``listings``:
        neither the ledger's thread nor the event loop waits for it (``batch_verdicts.UnreadSamples``)."""

        def read() -> bytes:
            return unread.json(answer, packed=packed)

        body = await asyncio.get_running_loop().run_in_executor(self.listings, read)
        return web.Response(body=body, content_type="application/json")

    def close(self) -> None:
        """The app stops: no listing is read any more (one being read finishes on its thread)."""
        self.listings.shutdown(wait=False)
        self.calls.close()

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
        answer = await self.call(self.ledger.commit, body, trusted=True)
        self.records.after_commit()  # the step's record is written after the answer, outside the lock
        return model_response(answer)
