"""The sections every process shares: ``[model]``, ``[tasks]``, ``[sampling]``, ``[orchestrator]``
(``config/orchestrator.py``, re-exported here), ``[shardcast]``."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from prime_rl.config.base import Section
from prime_rl.config.components import ImportPath
from prime_rl.config.orchestrator import OrchestratorConfig

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
