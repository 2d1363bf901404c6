"""The one HTTP client for the orchestrator API (used by worker, validator, trainer, evaluator).

Every call has a per-request timeout and bounded retries with exponential backoff (at least the
server's ``Retry-After``, honoured up to ``max_retry_after_s``) on connection errors, timeouts and
5xx/429 answers (``OrchestratorBusy`` when the last answer was a 429 (``busy`` lease backpressure
or ``rate_limited`` registration), else ``OrchestratorUnavailable``); a 4xx answer is the caller's fault and raises at once
(``ClientRequestError`` with the server's message). Every request the client retries is
idempotent on the server (see API.md), so a retry after a lost answer is safe.

Usage::

    client = OrchestratorClient("http://127.0.0.1:8700")
    reg = client.register("gpu-box-1")          # remembers the worker token
    lease = client.get_tasks(reg.worker_id)
    client.submit_rollouts(RolloutBatch(...))

Pitfall: a ``requests.Session`` is not safe to share between threads; use one client per thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import requests
from pydantic import BaseModel, ValidationError
from requests.adapters import HTTPAdapter

from prime_rl.api.client_errors import (
    ApiError,
    ClientRequestError,
    OrchestratorBusy,
    OrchestratorUnavailable,
    describe_connection_error,
)
from prime_rl.api.protocol import (
    BanRequest,
    BanResponse,
    BatchVerdicts,
    ClaimRequest,
    ClaimResponse,
    CommitRequest,
    CommitResponse,
    DoneRequest,
    DoneResponse,
    NoiseProfileAnswer,
    NoiseProfileRecord,
    PendingResponse,
    RegisterRequest,
    RegisterResponse,
    RolloutBatch,
    StatusResponse,
    SubmitResponse,
    SwitchRequest,
    SwitchResponse,
    TaskLease,
    ValidatorLeaseRequest,
    ValidatorLeaseResponse,
    VerdictRequest,
    VerdictResponse,
    WorkersResponse,
)

__all__ = [
    "ApiError",
    "ClientRequestError",
    "OrchestratorBusy",
    "OrchestratorClient",
    "OrchestratorUnavailable",
    "describe_connection_error",
    "orchestrator_reachable",
]

log = logging.getLogger(__name__)
R = TypeVar("R", bound=BaseModel)

_RETRY_STATUS = {429, 500, 502, 503, 504}


class _SourceAddress(HTTPAdapter):
    """Connections from one local address (``OrchestratorClient(source_address=...)``)."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


class OrchestratorClient:
    """Typed client for the orchestrator (one per thread).

    Args:
        base_url: e.g. ``http://127.0.0.1:8700``.
        timeout_s: per-request timeout (connect and read), default 30.
        retries: retries after the first attempt on transient failures, default 5.
        backoff_s: first backoff, doubled per retry up to ``max_backoff_s`` (default 0.25 -> 4 s).
        max_retry_after_s: longest server ``Retry-After`` honoured before a retry (default 60 s).
        admin_token: bearer token for the trusted endpoints (validator/trainer/ban).
        worker_token: bearer token of a registered worker (set by ``register``).
        registration_token: bearer token ``register`` sends (``orchestrator.registration_token``).
        sleep: how the client waits between attempts (default ``time.sleep``; tests inject one).
        source_address: local IP address to connect from (default: the system's choice), e.g. one of
            several addresses of a multi-homed host; the orchestrator sees its clients by address.
        on_answer: called after every attempt with ``(method, path, status, seconds)`` (status 0: no
            answer), e.g. ``role.orchestrator_call_times().record`` (the trusted roles' latencies).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        max_retry_after_s: float = 60.0,
        admin_token: str = "",
        worker_token: str = "",
        registration_token: str = "",
        sleep: Callable[[float], None] = time.sleep,
        source_address: str | None = None,
        on_answer: Callable[[str, str, int, float], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_answer = on_answer
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.admin_token = admin_token
        self.worker_token = worker_token
        self.registration_token = registration_token
        self.sleep = sleep
        self._resume_next = False  # the last GET /tasks got no answer: the next one asks with resume
        self._session = requests.Session()
        if source_address is not None:
            self._session.mount("http://", _SourceAddress(source_address))
            self._session.mount("https://", _SourceAddress(source_address))

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- transport

    def request(
        self,
        method: str,
        path: str,
        response_model: type[R],
        *,
        body: BaseModel | bytes | None = None,
        params: dict[str, Any] | None = None,
        token: str = "",
        retries: int | None = None,
        retry_params: dict[str, Any] | None = None,
    ) -> R:
        """Send one request with retries; parse the 2xx body into ``response_model``.

        ``body`` is a message (sent as its JSON) or raw bytes sent as they are (the red team's
        garbage, which the server must refuse). ``retry_params``: the query of every attempt after
        one that got no answer (a timeout or a lost connection), e.g. ``GET /tasks`` with ``resume``.
        """
        url = self.base_url + path
        data = body if isinstance(body, bytes) or body is None else body.model_dump_json().encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        attempts = 1 + (self.retries if retries is None else retries)
        last_problem = ""
        retry_after = 0.0
        busy = False
        for attempt in range(attempts):
            if attempt:
                backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                self.sleep(max(backoff, retry_after))
            started = time.monotonic()
            try:
                response = self._session.request(
                    method, url, data=data, params=params, headers=headers, timeout=self.timeout_s
                )
            except requests.RequestException as error:
                if self.on_answer is not None:
                    self.on_answer(method, path, 0, time.monotonic() - started)
                last_problem, busy, retry_after = describe_connection_error(error), False, 0.0
                params = retry_params if retry_params is not None else params
                log.debug("%s %s failed (attempt %d/%d): %s", method, path, attempt + 1, attempts, error)
                continue
            if self.on_answer is not None:
                self.on_answer(method, path, response.status_code, time.monotonic() - started)
            if response.status_code in _RETRY_STATUS:
                last_problem = f"HTTP {response.status_code}: {response.text[:200]}"
                busy = response.status_code == 429
                retry_after = self._retry_after(response)
                continue
            busy = False
            if 400 <= response.status_code < 500:
                error_code, message = "http_error", response.text[:500]
                try:
                    payload = response.json()
                    error_code = str(payload.get("error", error_code))
                    message = str(payload.get("message", message))
                except (ValueError, AttributeError):
                    pass
                raise ClientRequestError(response.status_code, error_code, message, path)
            if response.status_code >= 300:
                last_problem = f"unexpected HTTP {response.status_code}"
                continue
            try:
                return response_model.model_validate_json(response.content)
            except ValidationError as error:
                last_problem = f"unparsable answer: {error}"
                continue
        message = f"{method} {url}: no answer after {attempts} attempts ({last_problem})"
        if busy:
            raise OrchestratorBusy(message, problem=last_problem, retry_after_s=retry_after)
        raise OrchestratorUnavailable(message, problem=last_problem)

    def _retry_after(self, response: requests.Response) -> float:
        """The answer's ``Retry-After`` seconds, clipped to [0, max_retry_after_s] (0 if absent or
        unparsable; an HTTP-date form is not used by the orchestrator and counts as absent)."""
        try:
            seconds = float(response.headers.get("Retry-After", 0))
        except ValueError:
            return 0.0
        return min(self.max_retry_after_s, seconds) if math.isfinite(seconds) and seconds > 0 else 0.0

    # ------------------------------------------------------------- public endpoints

    def status(self) -> StatusResponse:
        """GET /status."""
        return self.request("GET", "/status", StatusResponse)

    def wait_until_up(
        self,
        timeout_s: float = 300.0,
        poll_s: float = 0.5,
        *,
        log_every_s: float = 30.0,
        alive: Callable[[], bool] | None = None,
    ) -> StatusResponse:
        """Poll /status until the orchestrator answers; returns its status.

        Logs what it waits for at once and then every ``log_every_s`` (INFO), so a wrong URL never
        looks like a hang. Raises ``OrchestratorUnavailable`` after ``timeout_s``, or as soon as
        ``alive()`` turns False (e.g. the orchestrator's process exited), with one line that says
        which URL, for how long, and the last problem (``connection refused``, ``cannot resolve
        host``, ...).
        """
        started = time.monotonic()
        next_log = started
        while True:
            try:
                return self.request("GET", "/status", StatusResponse, retries=0)
            except OrchestratorUnavailable as error:
                problem = getattr(error, "problem", str(error))
                waited = time.monotonic() - started
                if alive is not None and not alive():
                    raise OrchestratorUnavailable(
                        f"gave up waiting for the orchestrator at {self.base_url} ({problem})", problem=problem
                    ) from None
                if waited >= timeout_s:
                    raise OrchestratorUnavailable(
                        f"cannot reach the orchestrator at {self.base_url} after {waited:.0f} s ({problem}); "
                        "is `prime-rl orchestrator` running there? Check orchestrator.public_url "
                        "(or orchestrator.host/port)",
                        problem=problem,
                    ) from None
                if time.monotonic() >= next_log:
                    log.info(
                        "waiting for the orchestrator at %s (%s; %.0f s of %.0f s)",
                        self.base_url,
                        problem,
                        waited,
                        timeout_s,
                    )
                    next_log += log_every_s
                time.sleep(min(poll_s, max(0.0, timeout_s - waited)))

    def register(self, name: str = "") -> RegisterResponse:
        """POST /workers/register (with ``registration_token`` if set); remembers the returned token
        for /tasks and /rollouts. A 429 ``rate_limited`` or 503 ``worker_limit`` answer is retried
        after its ``Retry-After`` like any 429/5xx; registering twice makes two workers."""
        answer = self.request(
            "POST",
            "/workers/register",
            RegisterResponse,
            body=RegisterRequest(name=name),
            token=self.registration_token,
        )
        self.worker_token = answer.token
        return answer

    def get_tasks(
        self,
        worker_id: str,
        *,
        step: int | None = None,
        batch_index: int | None = None,
        version: int | None = None,
        resume: bool = False,
    ) -> TaskLease:
        """GET /tasks: the worker's next lease (or, with ``batch_index``, the same lease again; with
        ``resume``, after a restart, its oldest open lease if it holds one). ``version``: the policy
        version the worker holds, which a new lease fixes if it is inside the async window (else it
        fixes the newest committed one).

        An attempt that got no answer (timeout, lost connection) is retried with ``resume``, and so is
        the next call after one that failed: a lease
        the server granted to it, whose answer was lost, comes back instead of waiting to expire and
        count as abandoned (the server withdraws, uncharged, a lease it sees its client left). Meant
        for a worker that asks for its next lease with none of its own open (``worker.process``)."""
        params: dict[str, Any] = {"worker_id": worker_id}
        if version is not None:
            params["version"] = version
        if resume:
            params["resume"] = 1
        if step is not None:
            params["step"] = step
        if batch_index is not None:
            params["batch_index"] = batch_index
        retry = {**params, "resume": 1} if batch_index is None else None
        if retry is not None and self._resume_next:
            params = retry
        try:
            lease = self.request("GET", "/tasks", TaskLease, params=params, token=self.worker_token, retry_params=retry)
        except OrchestratorUnavailable:
            self._resume_next = retry is not None  # a lease granted to a lost attempt comes back next time
            raise
        self._resume_next = False
        return lease

    def submit_rollouts(self, batch: RolloutBatch) -> SubmitResponse:
        """POST /rollouts: returns once the batch is durably stored (idempotent for the same batch)."""
        return self.request("POST", "/rollouts", SubmitResponse, body=batch, token=self.worker_token)

    def announce_switch(
        self, worker_id: str, *, step: int, batch_index: int, policy_version: int, chunk: int
    ) -> SwitchResponse:
        """POST /leases/switch: announce that the lease ``(step, batch_index)`` switches to the committed
        ``policy_version`` at completion token ``32 * chunk``; the answer's ``nonce`` seeds every token
        from there on (``api.assignment.span_seed``). Idempotent: a retry of the same announcement gets
        the same nonce; ``ClientRequestError`` 409 when another chunk was announced for that version
        first (or the lease is closed, or the version is not newer), 422 when the version is not
        committed or the chunk is beyond the speed cap."""
        body = SwitchRequest(
            worker_id=worker_id, step=step, batch_index=batch_index, policy_version=policy_version, chunk=chunk
        )
        return self.request("POST", "/leases/switch", SwitchResponse, body=body, token=self.worker_token)

    def declare_done(self, worker_id: str, *, step: int, batch_index: int, digest: str) -> DoneResponse:
        """POST /leases/done: the lease ``(step, batch_index)`` is decoded; ``digest`` is
        ``api.spans.lease_digest`` of the samples the worker will submit (idempotent; 409 for another
        digest or a closed lease)."""
        body = DoneRequest(worker_id=worker_id, step=step, batch_index=batch_index, digest=digest)
        return self.request("POST", "/leases/done", DoneResponse, body=body, token=self.worker_token)

    def batch_verdicts(self, worker_id: str, batch_id: str) -> BatchVerdicts:
        """GET /rollouts/verdicts: how the validator judged one of this worker's batches, and why."""
        params = {"worker_id": worker_id, "batch_id": batch_id}
        return self.request("GET", "/rollouts/verdicts", BatchVerdicts, params=params, token=self.worker_token)

    def workers(
        self, *, offset: int = 0, limit: int = 100, order: str = "id", banned_only: bool = False
    ) -> WorkersResponse:
        """GET /workers: one page (``limit`` <= 500) of per-worker accounting, in registration
        ``order`` ("id") or most accepted samples first ("accepted"), with the table's totals."""
        params = {"offset": offset, "limit": limit, "order": order, "banned": "true" if banned_only else "false"}
        return self.request("GET", "/workers", WorkersResponse, params=params)

    # ------------------------------------------------------------- trusted endpoints

    def pending(self, limit: int = 8) -> PendingResponse:
        """GET /validator/pending: oldest batches awaiting verdicts."""
        params = {"limit": limit, "arrays": "packed"}  # (an orchestrator before packed arrays ignores it)
        return self.request("GET", "/validator/pending", PendingResponse, params=params, token=self.admin_token)

    def take_batches(self, validator_id: str, limit: int = 8, renew: Sequence[str] = ()) -> ValidatorLeaseResponse:
        """POST /validator/leases: renew the leases of ``renew``, take up to ``limit`` more batches
        exclusively (``orchestrator/validator_leases.py``)."""
        body = ValidatorLeaseRequest(validator_id=validator_id, limit=limit, renew=list(renew))
        return self.request(
            "POST", "/validator/leases", ValidatorLeaseResponse, body=body, params={"arrays": "packed"}, token=self.admin_token
        )

    def post_verdicts(self, verdicts: VerdictRequest) -> VerdictResponse:
        """POST /validator/verdicts (idempotent for identical verdicts)."""
        return self.request(
            "POST", "/validator/verdicts", VerdictResponse, body=verdicts, token=self.admin_token
        )

    def noise_profile(self) -> NoiseProfileRecord | None:
        """GET /validator/noise-profile: the run's honest-noise profile, None before one is published."""
        answer = self.request("GET", "/validator/noise-profile", NoiseProfileAnswer, token=self.admin_token)
        return answer.record

    def publish_noise_profile(self, record: NoiseProfileRecord) -> NoiseProfileRecord:
        """POST /validator/noise-profile/publish: the run's profile afterwards (``record``, or the one published first)."""
        answer = self.request(
            "POST", "/validator/noise-profile/publish", NoiseProfileAnswer, body=record, token=self.admin_token
        )
        if answer.record is None:  # the server always answers with a record here
            raise ClientRequestError(500, "bad_answer", "no record in the answer", "/validator/noise-profile/publish")
        return answer.record

    def ban(self, worker_id: str, reason: str) -> BanResponse:
        """POST /workers/ban."""
        return self.request(
            "POST",
            "/workers/ban",
            BanResponse,
            body=BanRequest(worker_id=worker_id, reason=reason),
            token=self.admin_token,
        )

    def claim(self, step: int, min_samples: int, *, filter_zero_advantage: bool = True) -> ClaimResponse:
        """POST /trainer/claim: the step's samples (same answer on every repeat for one step)."""
        body = ClaimRequest(step=step, min_samples=min_samples, filter_zero_advantage=filter_zero_advantage)
        return self.request("POST", "/trainer/claim", ClaimResponse, body=body, token=self.admin_token)

    def commit(self, step: int, policy_version: int) -> CommitResponse:
        """POST /trainer/commit: step's claim consumed and ``policy_version`` (= step + 1) published."""
        body = CommitRequest(step=step, policy_version=policy_version)
        return self.request("POST", "/trainer/commit", CommitResponse, body=body, token=self.admin_token)


def orchestrator_reachable(url: str, timeout_s: float) -> bool:
    """A process's first step: wait (logging every 30 s) until the orchestrator at ``url`` answers.

    False after logging one ERROR line that names the URL and the problem, so the process exits in
    seconds with that line instead of failing later with a traceback (or after loading a model).
    """
    try:
        with OrchestratorClient(url) as probe:
            probe.wait_until_up(timeout_s)
    except OrchestratorUnavailable as error:
        log.error("%s", error)
        return False
    return True
