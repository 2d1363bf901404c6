"""The ``[orchestrator]`` section: the HTTP service workers, validators and trainer talk to, and the
rules it leases, admits, releases and bans by."""

from __future__ import annotations

from pydantic import Field, model_validator

from prime_rl.config.base import Section

__all__ = ["OrchestratorConfig"]


class OrchestratorConfig(Section):
    """[orchestrator]: the HTTP service workers, validator and trainer talk to."""

    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 to accept remote workers).")
    port: int = Field(default=8700, ge=0, le=65535, description="HTTP port (0 = pick a free one).")
    public_url: str = Field(default="", description="URL others use to reach it (default http://host:port).")
    trusted_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="A listener of the trusted roles' own on this port (their endpoints: /validator/*, /trainer/*, "
        "POST /workers/ban, and /status, /health), with its own thread and event loop: their requests are read and "
        "answered however busy the swarm keeps the main port's loop; the validator and trainer use it "
        "(trusted_url). None = they share the main port; 0 = pick a free one.",
    )
    trusted_host: str = Field(
        default="", description="Bind address of the trusted listener ('' = host); e.g. a private network's."
    )
    trusted_public_url: str = Field(
        default="", description="URL the validator and trainer use to reach the trusted listener (default "
        "http://trusted_host:trusted_port).",
    )
    data_dir: str = Field(
        default="", description="Persistent store directory (default <run_dir>/orchestrator)."
    )
    keep_claimed_logprobs: bool = Field(
        default=False,
        description="Keep the per-token data of trained samples (the validator's and the worker's log-probs, the "
        "toploc proofs) in the run's training record (<data_dir>/record/) when their step is compacted; False "
        "drops it (tokens, rewards and verdicts are always kept; see the prime_rl README's retention section).",
    )
    async_level: int = Field(
        default=2,
        ge=0,
        description="A lease issued at step s fixes a policy version >= s - async_level (the dispatch window).",
    )
    max_off_policy_steps: int | None = Field(
        default=None,
        ge=0,
        description="Largest staleness of a trained rollout: the step it trains in minus the version that "
        "generated its oldest token, queue time included (prime-rl's name); older accepted samples are never "
        "handed to the trainer, only counted (stale_samples). None = async_level; must be >= async_level.",
    )
    max_versions_per_sample: int = Field(
        default=1,
        ge=1,
        le=2,
        description="In-flight weight updates (docs/inflight.md): 1 (default) = no in-flight switch accepted; 2 = a "
        "lease takes at most one switch (POST /leases/switch), so a worker gets at most one keep-or-reroll of its "
        "tails whatever version it asks for. 2 needs switch_deadline_s > 0 and max_decode_tokens_per_s > 0.",
    )
    switch_deadline_s: float = Field(
        default=0.0,
        ge=0,
        description="In-flight mandatory switch (docs/inflight.md section 4, part A): for every version committed "
        "while a lease is open, the worker must announce a switch to it or a newer one (POST /leases/switch) or "
        "declare the lease done (POST /leases/done) within this many seconds of the commit, or submit before; "
        "a later batch without either is refused (409) and the lease expires as abandoned. Covers download + "
        "load of a version. 0 = off; required > 0 when max_versions_per_sample is 2.",
    )
    max_decode_tokens_per_s: float = Field(
        default=0.0,
        ge=0,
        description="In-flight switch speed cap (docs/inflight.md section 4, part A), per hardware: POST /leases/switch "
        "refuses a chunk c with 32 c > max_decode_tokens_per_s * (seconds since the lease was issued) + 32, and a "
        "done whose batch is longer than that, so a worker cannot announce a switch beyond where any worker could "
        "have decoded. Set it to about 1.5x the per-sequence decode speed of the fastest hardware your workers use "
        "(tokens/s per sequence); 0 = off, required > 0 when max_versions_per_sample is 2.",
    )
    prompts_per_batch: int = Field(
        default=4, ge=1, description="Prompts per task lease (each sampled group_size times)."
    )
    task_timeout_s: float = Field(
        default=300.0, gt=0, description="A lease not submitted within this time is reassigned."
    )
    validator_lease_s: float = Field(
        default=120.0,
        gt=0,
        description="A validator holds the batches it takes (POST /validator/leases) for this long, renewable; "
        "a batch whose validator stops renewing goes back to the pool when its lease runs out.",
    )
    connect_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a worker, validator, trainer or `run` waits at start-up for the orchestrator to "
        "answer (logging every 30 s) before exiting with one line that names the URL.",
    )
    admin_token: str = Field(
        default="",
        description="Bearer token every trusted endpoint (validator, trainer, ban) requires; '' = one generated "
        "per run in <run_dir>/secrets/run.json (loopback only). Give it to validators and trainer, never workers.",
    )
    assignment_secret: str = Field(
        default="",
        description="HMAC key of task assignment and sampling seeds, shared with the validators only; "
        "'' = one generated per run in <run_dir>/secrets/run.json.",
    )
    registration_token: str = Field(
        default="",
        description="Bearer token POST /workers/register requires ('' = no token needed).",
    )
    registration_allowlist: list[str] = Field(
        default_factory=list,
        description="Client addresses or networks (CIDR) that may register; [] = any address.",
    )
    registration_hook: str = Field(
        default="",
        description="'package.module:function' deciding each registration (stake, proof of work): called with "
        "name, address, headers; True admits. '' = none.",
    )
    open_registration: bool = Field(
        default=False,
        description="Let anyone register on a non-loopback bind with no token, allow-list or hook (without it such "
        "an orchestrator refuses to start). Loopback binds are open when nothing is configured.",
    )
    register_rate_per_minute: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description="Registrations per minute one client address may sustain (429 beyond; 0 = no limit). "
        "30 lets a few restarting workers through; a registration flood fills the worker table slowly.",
    )
    register_burst: int = Field(
        default=30, ge=1, description="Registrations one client address may make at once (token bucket size)."
    )
    max_workers: int = Field(
        default=10_000,
        ge=1,
        description="Registered workers neither banned nor retired at most (503 worker_limit beyond).",
    )
    workers_view_max_age_s: float = Field(
        default=1.0,
        ge=0,
        allow_inf_nan=False,
        description="GET /workers serves a snapshot of the worker table rebuilt at most this often (0 = on every "
        "read), off the ledger's lock, so anonymous readers cost one rebuild per period whatever their number.",
    )
    max_fresh_workers_per_network: int = Field(
        default=16,
        ge=0,
        description="Identities without accepted work registered from one network (IPv4 /24, IPv6 /64) that may "
        "exist at once (429 rate_limited beyond; 0 = no limit). With 10,000 max_workers the table cannot fill "
        "with fresh identities from fewer than 625 networks.",
    )
    fresh_worker_ttl_s: float = Field(
        default=600.0,
        ge=0,
        allow_inf_nan=False,
        description="An identity with no accepted work this long after registering is retired (its slot in "
        "max_workers and its network's share free; the API then answers 404 and the worker registers anew), "
        "unless it holds a lease or has a batch awaiting verdicts, however often it asks (0 = never).",
    )
    registration_reserve: int = Field(
        default=256,
        ge=0,
        description="The last this many places of max_workers (at most a tenth of it) go only to registrations "
        "from a network holding no "
        "identity without accepted work now, so a newcomer from an untouched network finds a place unless an "
        "attacker holds ceil((max_workers - reserve) / max_fresh_workers_per_network) + reserve networks.",
    )
    max_buffered_samples: int = Field(
        default=0,
        ge=0,
        description="Admitted work at most: usable answered samples (awaiting validation, or accepted and "
        "claimable) plus the samples of every open lease; a lease that would pass it is refused (429 busy with "
        "Retry-After; 0 = no limit).",
    )
    fresh_buffered_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Of max_buffered_samples, the share up to which identities without accepted work (their open "
        "leases and batches awaiting verdicts) count against an established worker's lease (at least one lease): "
        "unproven work never holds established workers back by more; fresh identities fill only unused room.",
    )
    lease_judgeable: bool = Field(
        default=True,
        description="Lease only what can be judged and trained in the off-policy window: admitted work (open leases, "
        "batches awaiting verdicts, judged and unclaimed) stays within (claims left for this step's version) x "
        "min(trainer samples per step, validators' samples judged per second x step time), from moving estimates "
        "(orchestrator/judge_capacity.py); beyond it a lease is refused with 429 busy and a Retry-After, which "
        "costs the worker nothing. Cold start: trainer.samples_per_step until measured; one lease is always "
        "allowed while a claim can still take it (no deadlock). Identities without accepted work count against an "
        "established worker only up to fresh_buffered_share of each limit. "
        "benchmarks/results/lease_judgeable.md measures it (0-2% of honest samples expired at 256 identities "
        "with chaos, against 8-13% with it off).",
    )
    judge_rate_window_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Time constant of the validators' judged-samples-per-second estimate (seconds of work waiting "
        "for verdicts): a dead validator lowers it within about this long; idle time never does.",
    )
    max_open_leases: int = Field(
        default=4,
        ge=1,
        description="Unanswered leases one worker may hold at most: a new identity 1, one more per lease it "
        "answered, less one per lease it let expire.",
    )
    max_open_leases_per_address: int = Field(
        default=16,
        ge=1,
        description="Unanswered leases the identities without accepted work at one client address (IPv6: /64) "
        "may hold together, less one per abandoned lease there not offset by answered ones (at least 1); "
        "identities with accepted work are not counted or capped by it. Fresh identities refused by it wait "
        "in a first-come queue per address, so each gets its turn whatever the others there do.",
    )
    ban_abandoned_leases: int = Field(
        default=3,
        ge=1,
        description="Ban a worker once this many of its leases were abandoned (expired unanswered, or answered "
        "with a batch the validator rejected) and they are at least ban_abandoned_share of its leases. Each one "
        "also lowers its open-lease allowance by one.",
    )
    ban_abandoned_share: float = Field(
        default=0.25, gt=0, le=1, description="Share of a worker's leases abandoned before a ban (see above)."
    )
    machine_rejected_honest_share: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="The share of an honest worker's leases that rejections the machine may explain "
        "(tool_unverifiable, reward_unverifiable, internal_error, expired) can reach (measured: "
        "benchmarks/results/tool_replay_bench.md). They never count towards the abandonment ban; a worker is banned "
        "for them only when its share is above this one by a sequential test (1 = never).",
    )
    machine_rejected_false_ban: float = Field(
        default=1e-6,
        gt=0,
        lt=1,
        description="P(a worker whose leases are machine-rejected at most at machine_rejected_honest_share is ever "
        "banned for them) is at most this (Ville's inequality, orchestrator.lease_rules).",
    )
    release_after_tokens: int = Field(
        default=2048,
        ge=0,
        description="A worker's accepted samples reach a trainer claim only once the validator has accepted this "
        "many more of its completion tokens after them, so a deviation its evidence bans within that many tokens "
        "trains nothing (2,048: steering on 10% of positions and one stale step at lr 1e-5 are banned within "
        "2,000 on SmolLM2, README). Costs honest workers about one batch of latency; 0 = claimable at once.",
    )
    release_max_evidence: float = Field(
        default=0.25,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="...and only while that worker's evidence is below this fraction of the validator's ban "
        "threshold (honest workers stay below 0.06), so a deviation too weak to be banned trains nothing either "
        "once it lifts its worker's score above it. 1 = only the ban stops release.",
    )
    probation_tokens: int | None = Field(
        default=None,
        ge=0,
        description="A new identity is on probation until the validator accepted this many of its completion "
        "tokens with its evidence always below probation_max_evidence; its probation batches are released only "
        "after that, within the run-wide probation budget (null = release_after_tokens; 0 = no probation).",
    )
    probation_max_evidence: float = Field(
        default=0.1,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Evidence (fraction of the ban threshold) an identity must stay below during probation; one "
        "that reaches it is never trusted and nothing it sent on probation is trained on.",
    )
    probation_release_share: float = Field(
        default=0.1,
        ge=0,
        allow_inf_nan=False,
        description="Released probation tokens stay within this share of the tokens accepted after probation "
        "(run-wide), so steering spread over many fresh identities reaches training at most at this rate.",
    )
    gc_young_threshold: int = Field(
        default=50_000,
        ge=0,
        description="The interpreter's first garbage-collection threshold while the orchestrator serves "
        "(gc.set_threshold; 0 leaves it as it is). The default's 700 made a closed loop of 256 identities "
        "collect about 30 times a second, some 5-8% of the server's CPU; each collection stops every thread, "
        "and a larger threshold makes them rarer but longer (benchmarks/results/closed_loop.md, runs 16-18). "
        "It is process-wide: an embedding process shares it while a server runs.",
    )
    max_request_bytes: int = Field(default=64 * 2**20, ge=1024, description="Largest accepted request body.")
    max_samples_per_batch: int = Field(default=4096, ge=1, description="Largest accepted rollout batch.")
    max_tokens_per_sample: int = Field(
        default=1 << 17, ge=1, description="Max prompt + completion tokens per sample."
    )

    @model_validator(mode="after")
    def _check_secrets(self) -> OrchestratorConfig:
        for name in ("admin_token", "assignment_secret"):
            value = getattr(self, name)
            if value and (len(value) < 16 or value != value.strip()):
                raise ValueError(
                    f"orchestrator.{name} must be at least 16 characters without surrounding spaces "
                    "(or '' to generate one for this run); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                )
        if self.max_versions_per_sample > 1 and (self.switch_deadline_s <= 0 or self.max_decode_tokens_per_s <= 0):
            raise ValueError(
                "orchestrator.max_versions_per_sample = 2 (in-flight switches) needs the mandatory switch and the speed "
                f"cap: switch_deadline_s > 0 (got {self.switch_deadline_s:g}) and max_decode_tokens_per_s > 0 (got "
                f"{self.max_decode_tokens_per_s:g}). Without them a worker decodes the no-switch tail, scores it and "
                "then keeps it or announces a cut behind what it has seen: a free reroll (docs/inflight.md section 4)"
            )
        if self.trusted_port and self.trusted_port == self.port and (self.trusted_host or self.host) == self.host:
            raise ValueError(
                f"orchestrator.trusted_port ({self.trusted_port}) must differ from port: the trusted listener "
                "is a socket of its own (or null: the trusted roles share the main port)"
            )
        if self.max_off_policy_steps is not None and self.max_off_policy_steps < self.async_level:
            raise ValueError(
                f"orchestrator.max_off_policy_steps ({self.max_off_policy_steps}) must be >= async_level "
                f"({self.async_level}): a lease may fix a version async_level steps old, and its rollouts "
                "would be stale before they are generated"
            )
        return self

    @property
    def off_policy_bound(self) -> int:
        """``max_off_policy_steps``, or ``async_level`` when it is null: step s trains only samples whose
        (oldest) policy version is >= s - this."""
        return self.async_level if self.max_off_policy_steps is None else self.max_off_policy_steps

    @property
    def probation_tokens_or_default(self) -> int:
        """``probation_tokens``, or ``release_after_tokens`` when it is null."""
        return self.release_after_tokens if self.probation_tokens is None else self.probation_tokens

    @property
    def url(self) -> str:
        """Base URL of the orchestrator (``public_url`` or ``http://host:port``)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        return _http_url(self.host, self.port)

    @property
    def trusted_url(self) -> str:
        """Base URL of the trusted listener (``trusted_public_url`` or ``http://trusted_host:trusted_port``);
        ``url`` when there is none (``trusted_port`` null). The validator and trainer call it."""
        if self.trusted_port is None:
            return self.url
        if self.trusted_public_url:
            return self.trusted_public_url.rstrip("/")
        return _http_url(self.trusted_host or self.host, self.trusted_port)


def _http_url(host: str, port: int) -> str:
    """``http://host:port``, a wildcard bind address reached on loopback."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
