"""The sections every process shares: ``[model]``, ``[tasks]``, ``[sampling]``, ``[orchestrator]``,
``[shardcast]``."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from prime_rl.config.base import Section
from prime_rl.config.components import ImportPath

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "ENVIRONMENT_ENTRY_POINTS",
    "GENERATED_SOURCES",
    "TASK_FIELDS",
    "CodeTasksConfig",
    "EnvironmentConfig",
    "ModelConfig",
    "OrchestratorConfig",
    "SamplingConfig",
    "ShardcastConfig",
    "TasksConfig",
]

TASK_FIELDS = ("prompt", "answer", "task_type", "verification_info", "problem_id", "solve_rate")
"""The task fields ``[tasks] columns`` may map to a file's columns."""

GENERATED_SOURCES = ("arithmetic", "mix")
"""``tasks.source`` values that generate seeded problems instead of reading a file."""


class ModelConfig(Section):
    """[model]: the policy's initial weights and tokenizer."""

    path: str = Field(
        default="", description="HF from_pretrained directory holding the model and its tokenizer."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="Compute dtype of every process (fp32 is faster on CPUs without bf16)."
    )


class CodeTasksConfig(Section):
    """[tasks.code]: the code family of ``tasks.source = "mix"``: "Use Python to compute 47 * 30.",
    scored by running the completion's last fenced Python block in verifiers' sandbox."""

    share: float = Field(default=0.5, ge=0, le=1, description="Fraction of the mix's tasks that are code tasks.")
    ops: list[str] = Field(default_factory=lambda: ["+", "-", "*"], description="Operators of the code tasks.")
    digits: int = Field(default=2, ge=1, le=18, description="Max digits per operand of a code task.")
    min_digits: int = Field(default=2, ge=1, le=18, description="Min digits per operand of a code task.")
    template: str = Field(
        default="Use Python to compute {expression}.",
        description="Text of one code task; '{expression}' is replaced by the problem.",
    )

    @model_validator(mode="after")
    def _check(self) -> CodeTasksConfig:
        if self.min_digits > self.digits:
            raise ValueError("tasks.code.min_digits must be <= tasks.code.digits")
        return self


BUILTIN_ENVIRONMENTS = ("single_turn", "python_tool", "calculator")
"""``[tasks.environment] name`` values that need no import."""

ENVIRONMENT_ENTRY_POINTS = "verifiers.environments"
"""The entry-point group an installed package registers environments under (a name -> an
``Environment`` subclass, a factory returning one, or an instance), e.g. in its pyproject.toml::

    [project.entry-points."verifiers.environments"]
    unit_converter = "my_envs.units:UnitConverterEnv"
"""


class EnvironmentConfig(Section):
    """[tasks.environment]: single-turn samples, or multi-turn episodes in a ``verifiers`` environment
    (a built-in, one of yours by import path, or one an installed package registers)."""

    name: str = Field(
        default="single_turn",
        description="'single_turn': one completion per sample (the run's reward); 'python_tool' / 'calculator': "
        "episodes whose model turns call a sandboxed Python tool / an exact calculator (<tool_call> JSON, "
        "verifiers.envs), scored by the environment's rubric; 'module:attribute' or 'path/to/file.py:attribute': "
        "your verifiers.envs.Environment (a subclass or factory called with [tasks.environment.args], or an "
        "instance); any other name: one registered under the entry-point group 'verifiers.environments'.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of your environment's class or factory (an import path or entry point); "
        "the built-ins take max_turns, feedback and tool_timeout_s below instead.",
    )
    max_turns: int = Field(
        default=4, ge=1, le=32, description="Model turns per episode of a built-in environment (each up to max_new_tokens)."
    )
    feedback: bool = Field(
        default=False,
        description="Built-ins: answer a wrong final answer with 'try again' and go on (until right or out of turns).",
    )
    turn_template: str = Field(
        default="\n<{role}>\n{content}\n</{role}>\n",
        description="Text the environment inserts per message ({role}: 'tool' or 'user'; {content}: its text).",
    )
    tool_timeout_s: float = Field(default=5.0, gt=0, le=60, description="Wall-clock limit of one Python tool run.")
    tool_python: str = Field(
        default="",
        pattern=r"^(3\.\d{1,2})?$",
        description="Multi-turn runs: the Python version ('3.11') every worker's and validator's Python tool must run, "
        "stated in GET /status; a worker or validator whose tool runs another refuses to start (tracebacks and library "
        "behaviour differ between minor versions, so its tool outputs would not match). '' = the version of the "
        "orchestrator machine's Python tool, probed at start.",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvironmentConfig:
        if "{content}" not in self.turn_template:
            raise ValueError("tasks.environment.turn_template must contain '{content}'")
        if ":" in self.name:
            ImportPath.parse(self.name)  # syntax only: the role that plays episodes imports it
        elif self.name not in BUILTIN_ENVIRONMENTS and not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise ValueError(
                f"tasks.environment.name {self.name!r} is neither a built-in ({', '.join(BUILTIN_ENVIRONMENTS)}), "
                "an import path 'module:attribute' / 'file.py:attribute', nor an entry-point name"
            )
        if self.args and self.name in BUILTIN_ENVIRONMENTS:
            raise ValueError(
                f"tasks.environment.args is for your own environments; {self.name!r} takes max_turns, feedback "
                "and tool_timeout_s"
            )
        return self


class TasksConfig(Section):
    """[tasks]: the training task set (identical in every process; task ids index into it)."""

    source: Literal["arithmetic", "mix", "jsonl", "parquet", "datasets"] = Field(
        default="arithmetic",
        description="Seeded arithmetic generator; 'mix': seeded math tasks (the [tasks] arithmetic settings, "
        "scored by the math verifier: a boxed answer) and code tasks ([tasks.code], run in the sandbox); a "
        ".jsonl or .parquet file; or 'datasets': a Hugging Face dataset from local files (a save_to_disk "
        "folder, a folder of data files, or one file; pip install 'intellect2-prime-rl[datasets]').",
    )
    path: str = Field(default="", description="File or folder of the tasks (ignored for 'arithmetic').")
    split: str = Field(default="train", description="Split of a 'datasets' source.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Your column names for the task fields, e.g. {prompt = 'question', answer = 'answer'}. Fields: "
        "prompt, answer (becomes verification_info.ground_truth), task_type, verification_info, problem_id, "
        "solve_rate. Unmapped fields use the INTELLECT-2 column names.",
    )
    task_type: str = Field(
        default="verifiable_math",
        description="Task type (verifier) of rows that have none, e.g. 'verifiable_math' or 'prime_rl_code'.",
    )
    chat_template: bool = Field(
        default=False,
        description="Send each prompt as one user message through the tokenizer's chat template (instruct "
        "models); the same in worker, validator and evaluator.",
    )
    system_prompt: str = Field(
        default="", description="System message before each prompt when chat_template is on ('' = none)."
    )
    num_tasks: int = Field(
        default=1000, ge=1, description="Number of tasks (arithmetic) or max rows to read (files)."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the arithmetic and mix generators.")
    test_share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Share of the generated problem space (by a hash of each problem's prompt, "
        "prime_rl.tasks.in_test_split) kept out of training for the evaluator's test split "
        "(evaluator.split = 'test'); arithmetic and mix sources only. 0 = none kept out.",
    )
    ops: list[str] = Field(default_factory=lambda: ["+"], description="Arithmetic operators to draw from.")
    digits: int = Field(default=2, ge=1, le=18, description="Max digits per arithmetic operand.")
    min_digits: int = Field(default=1, ge=1, le=18, description="Min digits per arithmetic operand.")
    terms: int = Field(default=2, ge=2, le=8, description="Operands per arithmetic problem.")
    match: Literal["first_integer", "last_integer", "boxed"] = Field(
        default="first_integer", description="How the arithmetic verifier reads the answer in a completion."
    )
    arithmetic_template: str = Field(
        default="What is {expression}? Answer with the number only.",
        description="Text of one arithmetic task; '{expression}' is replaced by the problem (e.g. '3 + 4').",
    )
    code: CodeTasksConfig = Field(
        default_factory=CodeTasksConfig, description="The code tasks of tasks.source = 'mix'."
    )
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig, description="Single-turn samples or multi-turn tool episodes."
    )
    prompt_template: str = Field(
        default="{prompt}",
        description="Prompt text sent to the model; '{prompt}' is replaced by the task's prompt.",
    )
    prompt_templates: dict[str, str] = Field(
        default_factory=dict,
        description="Per task type prompt templates, e.g. {verifiable_math = '...{prompt}...'}: a task whose "
        "task_type is a key uses that template instead of prompt_template (few-shot examples of its own family).",
    )

    difficulty_key: str = Field(
        default="",
        description="Row field with a pass rate for the offline difficulty filter ('' = no filter).",
    )
    min_pass_rate: float = Field(default=0.0, ge=0, le=1, description="Keep tasks with pass rate >= this.")
    max_pass_rate: float = Field(default=1.0, ge=0, le=1, description="Keep tasks with pass rate <= this.")
    length_reward: Literal["none", "exact", "max", "clip"] = Field(
        default="none",
        description="Length reward mode toward a per-prompt thinking budget (verifiers.length).",
    )
    length_alpha: float = Field(
        default=3e-4, ge=0, description="Length reward slope per token (INTELLECT-2: 3e-4)."
    )
    target_lengths: list[int] = Field(
        default_factory=lambda: [2000, 4000, 6000, 8000, 10000],
        description="Thinking budgets T; one drawn per task, seeded by (tasks.seed, task id).",
    )
    target_lengths_by_type: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Per task type budgets, e.g. {verifiable_math = [40], prime_rl_code = [48]}: a task whose "
        "task_type is a key draws its budget from that list instead of target_lengths (a sum needs fewer "
        "tokens than a program).",
    )

    @model_validator(mode="after")
    def _check(self) -> TasksConfig:
        if self.test_share > 0 and self.source not in GENERATED_SOURCES:
            raise ValueError(
                "tasks.test_share keeps generated problems out of training; for a file source give the "
                "evaluator its own file instead (evaluator.tasks = {path = 'test.parquet'})"
            )
        if "{prompt}" not in self.prompt_template:
            raise ValueError("tasks.prompt_template must contain '{prompt}'")
        for task_type, template in self.prompt_templates.items():
            if "{prompt}" not in template:
                raise ValueError(f"tasks.prompt_templates.{task_type} must contain '{{prompt}}'")
        if self.min_pass_rate > self.max_pass_rate:
            raise ValueError("tasks.min_pass_rate must be <= tasks.max_pass_rate")
        if self.length_reward != "none" and (not self.target_lengths or min(self.target_lengths) <= 0):
            raise ValueError("tasks.target_lengths must be non-empty positive token counts")
        for task_type, lengths in self.target_lengths_by_type.items():
            if not lengths or min(lengths) <= 0:
                raise ValueError(f"tasks.target_lengths_by_type.{task_type} must be non-empty positive token counts")
        if self.min_digits > self.digits:
            raise ValueError("tasks.min_digits must be <= tasks.digits")
        if self.source not in GENERATED_SOURCES and not self.path:
            raise ValueError(f"tasks.path is required for tasks.source = {self.source!r}")
        unknown = set(self.columns) - set(TASK_FIELDS)
        if unknown:
            raise ValueError(f"tasks.columns: unknown task fields {sorted(unknown)}; use {list(TASK_FIELDS)}")
        if self.system_prompt and not self.chat_template:
            raise ValueError("tasks.system_prompt needs tasks.chat_template = true")
        return self


class SamplingConfig(Section):
    """[sampling]: how workers sample (the validator checks samples against these)."""

    group_size: int = Field(default=8, ge=1, le=1024, description="Completions per prompt (GRPO group).")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    max_new_tokens: int = Field(default=16, ge=1, description="Max completion tokens per sample.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (the stop text is kept).")


class OrchestratorConfig(Section):
    """[orchestrator]: the HTTP service workers, validator and trainer talk to."""

    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 to accept remote workers).")
    port: int = Field(default=8700, ge=0, le=65535, description="HTTP port (0 = pick a free one).")
    public_url: str = Field(default="", description="URL others use to reach it (default http://host:port).")
    data_dir: str = Field(
        default="", description="Persistent store directory (default <run_dir>/orchestrator)."
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
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"


class ShardcastConfig(Section):
    """[shardcast]: the weight broadcast tree (trainer -> origin -> relays -> workers)."""

    host: str = Field(default="127.0.0.1", description="Host the origin and relays bind and are reached at.")
    origin_port: int = Field(
        default=8701, ge=1, le=65535, description="Port of the origin the trainer publishes to."
    )
    relay_ports: list[int] = Field(
        default_factory=lambda: [8702], description="Ports of relays `run` starts."
    )
    servers: list[str] = Field(
        default_factory=list, description="URLs clients fetch from (default: the relays, then the origin)."
    )
    data_dir: str = Field(
        default="", description="Directory for origin/relay data (default <run_dir>/shardcast)."
    )
    keep_versions: int = Field(default=5, ge=1, description="Policy versions kept by the origin and relays.")
    delta: bool = Field(
        default=True,
        description=(
            "Trainer also publishes each version as xor-zstd deltas against the previous one; a store "
            "holding that version downloads only the deltas (others fall back to full shards)."
        ),
    )

    @property
    def origin_url(self) -> str:
        return f"http://{self.host}:{self.origin_port}"

    @property
    def client_servers(self) -> list[str]:
        """Where clients fetch weights: ``servers`` if set, else every relay then the origin."""
        if self.servers:
            return list(self.servers)
        return [f"http://{self.host}:{port}" for port in self.relay_ports] + [self.origin_url]
