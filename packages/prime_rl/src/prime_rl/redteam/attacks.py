"""Hostile worker behaviours, selectable by name, for tests and red-team runs.

Each attack answers a lease the way a cheating worker would; the validator must reject every
sample with one of the reasons in its row (the honest worker's samples must all be accepted).
The table is rendered from :data:`ATTACKS`, the one list of attacks (``prime-rl worker
--workers.behaviour NAME`` takes a name from it, ``"honest"`` or ``"mixed"``):

{table}

``mixed`` answers each lease with the attack ``MIXED_CYCLE[batch_index % len(MIXED_CYCLE)]`` (the
attacks marked "mixed", in table order; in a multi-turn run the episode attacks, ``EPISODE_CYCLE``,
come first). Other members of a rejected sample's group get
``group_rejected``, the rest of its batch ``lease_rejected``. An attack with a "refused" answer
never reaches the validator: the orchestrator refuses its batch at submission (that answer, and the
lease expires unanswered).

The span forgeries (in-flight weight updates, ``api/spans.py``; not in ``mixed``) each decode the
lease for real with the HF backend, switching in flight to a newer committed version where the
attack needs one (:mod:`prime_rl.redteam.spans`), and then claim other version spans. They
need the worker's committed versions (``HostileWorker.versions``) and a single-turn run.

The attacks' building blocks live by behaviour family: the single-turn forgeries of an honest batch
(other weights, edited prompt, made-up completions, inflated rewards, garbage proofs) in
:mod:`prime_rl.redteam.forgeries`, the episode tampering in :mod:`prime_rl.redteam.episodes`, the
span forgeries' decoding in :mod:`prime_rl.redteam.spans`. This module keeps the one table and the
worker that picks an attack per lease.

A new attack is one :data:`ATTACKS` entry plus a ``HostileWorker._<name>(lease, backend)`` method
that builds its batch; the worker loop reaches it only through :class:`HostileWorker`'s hooks
(:attr:`~HostileWorker.follows_new_weights`, :meth:`~HostileWorker.ready`,
:meth:`~HostileWorker.answer`, :meth:`~HostileWorker.before_submit`).
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prime_rl.api.client import ClientRequestError, OrchestratorClient, OrchestratorUnavailable
from prime_rl.api.protocol import RolloutBatch, RolloutSample, StatusResponse, SubmitResponse, TaskLease
from prime_rl.api.spans import SPAN_ALIGN
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import GenerationBackend, HFBackend, VersionSwitch
from prime_rl.redteam.episodes import (
    ForgingEnv,
    drop_turn,
    env_as_model,
    model_as_env,
    reorder_turns,
    truncate_episode,
)
from prime_rl.redteam.forgeries import (
    edited_prompt,
    fabricated_batch,
    garbage_body,
    garbled,
    inflated,
    perturbed_copy,
)
from prime_rl.redteam.spans import (
    MidChunkSwitch,
    SpanVersions,
    SwitchAt,
    points,
    relabel,
    switching,
    wait_for_newer,
)
from prime_rl.worker.episodes import build_episode_batch
from prime_rl.worker.rollout import PlannedTask, build_batch, plan_lease

log = logging.getLogger(__name__)

SPAN_WAIT_MARGIN_S = 15.0
"""A span attack waits for a newer committed version until this long before its lease's deadline
(then it gives the lease up: decode and submission need the rest)."""

@dataclass(frozen=True)
class Attack:
    """One hostile behaviour: what it does, the verdict reasons its samples get, and whether
    ``mixed`` cycles through it."""

    does: str
    expected: tuple[str, ...]
    mixed: bool = True
    episodes: bool = False
    """Tampers with multi-turn episodes: only in a multi-turn run ([tasks.environment]), where
    ``mixed`` plays these first."""
    spans: bool = False
    """Forges in-flight version spans: needs the worker's committed versions (single-turn runs)."""
    refused: str = ""
    """The orchestrator's answer at submission when it refuses the batch (then no verdict: ``expected``
    is empty), e.g. ``"422 bad_spans"``."""


ATTACKS: dict[str, Attack] = {
    "other_weights": Attack("samples with a perturbed copy of the policy", ("toploc_mismatch",)),
    "changed_prompt": Attack("generates for (and submits) an edited prompt", ("wrong_prompt",)),
    "fabricated_completion": Attack(
        'submits made-up completions "proved" by one prefill (honest proofs and log-probs over unsampled tokens)',
        ("sampling_mismatch",),
    ),
    "inflated_rewards": Attack("claims reward + 1 for every completion", ("reward_mismatch",)),
    "unassigned_tasks": Attack("answers tasks that are not in its lease", ("not_assigned",)),
    "garbage": Attack(
        "posts garbage bytes (answered 400) and submits random proof bytes", ("malformed_proof", "toploc_mismatch")
    ),
    "stale_policy": Attack(
        "never reloads weights and claims its true old version; takes leases only once min_policy_version > 0, "
        "so every batch is stale (in mixed: claims min_policy_version - 1, or inflates rewards while that "
        "would be negative)",
        ("stale_policy",),
    ),
    # multi-turn runs only ([tasks.environment]): tampering with honestly played episodes
    "forged_tool_output": Attack(
        "plays each episode with made-up tokens as the first tool output (the model answers them)",
        ("tool_output_mismatch",),
        episodes=True,
    ),
    "dropped_turn": Attack("leaves out model turn 0 and the reply to it", ("turn_dropped",), episodes=True),
    "reordered_turn": Attack("swaps model turns 0 and 1", ("turn_reordered",), episodes=True),
    "truncated_episode": Attack("keeps only model turn 0 of each episode", ("episode_truncated",), episodes=True),
    "model_as_env": Attack("labels turn 0's last sampled token as an env token", ("model_tokens_as_env",), episodes=True),
    "env_as_model": Attack("labels the first tool output as model tokens", ("env_tokens_as_model",), episodes=True),
    # in-flight version spans (redteam/spans.py): a real decode, then a forged span claim
    "forged_span_version": Attack(
        "announces a switch to the newest committed version at token 32, then decodes with the lease's version "
        "v alone (with the switch's seeds from 32) and claims the tokens from 32 on as the newer version",
        ("span_version_forged",),
        mixed=False,
        spans=True,
    ),
    "future_span_version": Attack(
        "decodes with v alone, claims the tokens from 32 on as a version not yet committed",
        (),
        mixed=False,
        spans=True,
        refused="422 bad_spans",
    ),
    "shifted_span_boundary": Attack(
        "switches to the newer version at token 32 (announced), claims the switch at 64 (samples ended before 64 "
        "claim none)",
        ("span_boundary_mismatch", "span_missing_mandatory"),
        mixed=False,
        spans=True,
    ),
    "mid_chunk_switch": Attack(
        "announces a switch at token 32 and draws with its seeds from there, but switches weights at token 48, "
        "inside a proof chunk (the chunk of the switch fails; the next passes, keep-KV: the version began after "
        "its claimed boundary)",
        ("span_boundary_mismatch", "span_version_forged", "sampling_mismatch"),
        mixed=False,
        spans=True,
    ),
    "partial_switch": Attack(
        "switches at token 32 (announced), then drops the switch from every other sample that made it",
        ("span_missing_mandatory",),
        mixed=False,
        spans=True,
    ),
    "too_many_spans": Attack(
        "switches at token 32, then claims more versions per sample than the run allows",
        (),
        mixed=False,
        spans=True,
        refused="422 bad_spans",
    ),
}
"""Every attack by name, in ``mixed``'s order: the table above, the tests and the red team read it."""

BEHAVIOURS = ("honest", *ATTACKS, "mixed")
"""The names ``workers.behaviour`` takes."""

MIXED_CYCLE = tuple(name for name, attack in ATTACKS.items() if attack.mixed and not attack.episodes)
"""The order in which ``mixed`` cycles through the attacks (by lease batch index)."""

EPISODE_CYCLE = tuple(name for name, attack in ATTACKS.items() if attack.mixed and attack.episodes)
"""In a multi-turn run ``mixed`` cycles through these first, then :data:`MIXED_CYCLE`."""

EXPECTED_REASONS: dict[str, tuple[str, ...]] = {"honest": ("ok",)} | {
    name: attack.expected for name, attack in ATTACKS.items()
}
"""Verdict reasons each behaviour's samples must get (group mates of a rejected sample: ``group_rejected``)."""


def span_attack(behaviour: str) -> bool:
    """Whether ``behaviour`` forges in-flight version spans (it needs the worker's committed versions)."""
    return behaviour in ATTACKS and ATTACKS[behaviour].spans


def attack_table(width: int = 54) -> str:
    """:data:`ATTACKS` as the reStructuredText table of this module's docstring."""
    rows = [("name", "what it does", "expected verdict", "mixed")]
    for name, attack in ATTACKS.items():
        does = textwrap.wrap(attack.does, width)
        reasons = [f"``{reason}``" + (" or" if i < len(attack.expected) - 1 else "") for i, reason in enumerate(attack.expected)]
        if attack.refused:
            reasons.append(f"refused: {attack.refused}")
        for line in range(max(len(does), len(reasons))):
            rows.append((
                f"``{name}``" if line == 0 else "",
                does[line] if line < len(does) else "",
                reasons[line] if line < len(reasons) else "",
                ("yes" if attack.mixed else "no") if line == 0 else "",
            ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    rule = "  ".join("=" * w for w in widths)
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([rule, lines[0], rule, *lines[1:], rule])


__doc__ = (__doc__ or "").replace("{table}", attack_table())


@dataclass
class HostileWorker:
    """Builds rollout batches for one behaviour (``"honest"`` = the real worker's answer).

    ``encode(text)`` tokenises a prompt, ``score(task_id, text, num_tokens)`` is the worker's reward,
    ``prompt_tokens(task_id)`` gives any task's prompt (for unassigned tasks), ``num_tasks`` is
    the task set's size. (No worker can compute the assignment: it is keyed with a secret.)
    """

    behaviour: str
    encode: Callable[[str], Sequence[int]]
    score: Callable[[int, str, int], float]
    prompt_tokens: Callable[[int], Sequence[int]]
    num_tasks: int
    env: EpisodeEnv | None = None
    """The run's episode environment (None: a single-turn run; the episode attacks need one)."""
    versions: SpanVersions | None = None
    """The worker's committed, downloaded versions (``worker.inflight.CommittedVersions``; the span
    forgeries need them)."""
    _other: GenerationBackend | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {self.behaviour!r}; choose one of {BEHAVIOURS}")
        missing = [name for name in ATTACKS if not callable(getattr(self, f"_{name}", None))]
        if missing:  # an ATTACKS entry without its method: fail at start, not on the batch that needs it
            raise TypeError(f"attacks without a HostileWorker._<name> method: {missing}")
        if self.behaviour in ATTACKS and ATTACKS[self.behaviour].episodes and self.env is None:
            raise ValueError(f"{self.behaviour} tampers with episodes: it needs a multi-turn run ([tasks.environment] name)")
        if span_attack(self.behaviour) and (self.versions is None or self.env is not None):
            raise ValueError(f"{self.behaviour} forges version spans: it needs a single-turn run and the worker's versions")

    # -- the hooks the worker loop calls -------------------------------------------------------
    @property
    def follows_new_weights(self) -> bool:
        """False for ``stale_policy``: it never reloads (nor waits for) a newer policy version."""
        return self.behaviour != "stale_policy"

    def ready(self, status: StatusResponse) -> bool:
        """Whether to take a lease now: ``stale_policy`` waits until a version can be too old."""
        return self.behaviour != "stale_policy" or status.min_policy_version > 0

    def resolve(self, lease: TaskLease) -> str:
        """The concrete behaviour used for ``lease`` (``mixed`` picks one by batch index)."""
        if self.behaviour != "mixed":
            return self.behaviour
        cycle = EPISODE_CYCLE + MIXED_CYCLE if self.env is not None else MIXED_CYCLE
        kind = cycle[lease.batch_index % len(cycle)]
        if kind == "stale_policy" and lease.min_policy_version == 0:
            return "inflated_rewards"  # no version is too old yet
        return kind

    def answer(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        """The batch this behaviour submits for ``lease`` (built by its ``_<name>`` method)."""
        build: Callable[[TaskLease, GenerationBackend], RolloutBatch] = getattr(self, f"_{self.resolve(lease)}")
        return build(lease, backend)

    def before_submit(self, lease: TaskLease, client: OrchestratorClient) -> None:
        """``garbage`` first posts random bytes as a rollout body (the orchestrator must answer 400)."""
        if self.resolve(lease) != "garbage":
            return
        try:
            client.request("POST", "/rollouts", SubmitResponse, body=garbage_body(), token=client.worker_token, retries=0)
            log.warning("garbage body was accepted")
        except (ClientRequestError, OrchestratorUnavailable) as exc:
            log.info("garbage body refused: %s", exc)

    # -- one method per attack: _<name>(lease, backend) -> the batch it submits -------------------
    def _build(self, lease: TaskLease, backend: GenerationBackend, plan: list[PlannedTask] | None = None) -> RolloutBatch:
        if self.env is not None:  # a multi-turn run: the honest episodes the attack starts from
            return build_episode_batch(lease, backend, self.env, encode=self.encode, plan=plan)[0]
        return build_batch(lease, backend, encode=self.encode, score=self.score, plan=plan)[0]

    def _tampered(
        self, lease: TaskLease, backend: GenerationBackend, tamper: Callable[[RolloutSample], RolloutSample]
    ) -> RolloutBatch:
        if self.env is None:
            raise ValueError(f"{self.behaviour} needs a multi-turn run ([tasks.environment] name)")
        batch = self._build(lease, backend)
        return batch.model_copy(update={"samples": [tamper(s) for s in batch.samples]})

    def _forged_tool_output(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        if self.env is None:
            raise ValueError(f"{self.behaviour} needs a multi-turn run ([tasks.environment] name)")
        return build_episode_batch(lease, backend, ForgingEnv(self.env), encode=self.encode)[0]

    def _dropped_turn(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._tampered(lease, backend, drop_turn)

    def _reordered_turn(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._tampered(lease, backend, reorder_turns)

    def _truncated_episode(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._tampered(lease, backend, truncate_episode)

    def _model_as_env(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._tampered(lease, backend, model_as_env)

    def _env_as_model(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._tampered(lease, backend, env_as_model)

    # -- span forgeries: a real decode of the lease, then a forged claim of which version did what --
    def _newer(self, lease: TaskLease, backend: GenerationBackend) -> tuple[HFBackend, int, VersionSwitch]:
        """The HF backend, the lease's version and the next committed, downloaded version (waited for)."""
        if not isinstance(backend, HFBackend) or self.versions is None:
            raise TypeError(f"{self.behaviour} needs an HFBackend and the worker's committed versions")
        start = backend.policy_version
        return backend, start, wait_for_newer(self.versions, start, lease.deadline - SPAN_WAIT_MARGIN_S)

    def _switched(self, lease: TaskLease, backend: GenerationBackend) -> tuple[RolloutBatch, int, int]:
        """The lease decoded honestly with an in-flight switch to the newer version at token 32."""
        hf, start, switch = self._newer(lease, backend)
        with switching(hf, SwitchAt(switch)):
            batch = self._build(lease, hf)
        return batch, start, switch.version

    def _forged_span_version(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        hf, start, switch = self._newer(lease, backend)  # announced and committed: the claim matches the record
        # every token sampled by the lease's version, from 32 on with the announced switch's seeds
        batch = self._build(lease, MidChunkSwitch(hf, switch, SPAN_ALIGN, start, load=False))
        claim = [(start, 0), (switch.version, SPAN_ALIGN)]
        return relabel(batch, lambda i, s: claim if len(s.completion_tokens) > SPAN_ALIGN else None)

    def _future_span_version(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        if self.versions is None:
            raise TypeError(f"{self.behaviour} needs the worker's committed versions")
        start = backend.policy_version
        # Two past the committed one: a committed() answer up to one poll old stays in the future.
        claim = [(start, 0), (max(self.versions.committed(), start) + 2, SPAN_ALIGN)]
        batch = self._build(lease, backend)
        return relabel(batch, lambda i, s: claim if len(s.completion_tokens) > SPAN_ALIGN else None)

    def _shifted_span_boundary(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        batch, start, version = self._switched(lease, backend)
        claim = [(start, 0), (version, 2 * SPAN_ALIGN)]
        return relabel(batch, lambda i, s: claim if len(s.completion_tokens) > 2 * SPAN_ALIGN else None)

    def _mid_chunk_switch(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        hf, start, switch = self._newer(lease, backend)
        # the announced switch's seeds from 32, as the record says; the weights from 48
        batch = self._build(lease, MidChunkSwitch(hf, switch, SPAN_ALIGN + SPAN_ALIGN // 2, start, reseed_at=SPAN_ALIGN))
        claim = [(start, 0), (switch.version, SPAN_ALIGN)]
        return relabel(batch, lambda i, s: claim if len(s.completion_tokens) > SPAN_ALIGN else None)

    def _partial_switch(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        batch, _, _ = self._switched(lease, backend)
        switched = [i for i, s in enumerate(batch.samples) if s.spans]
        dropped = set(switched[1::2])
        return relabel(batch, lambda i, s: None if i in dropped else points(s))

    def _too_many_spans(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        batch, _, version = self._switched(lease, backend)
        assert self.versions is not None  # _switched checked it
        extra = self.versions.max_versions  # spans: the real two, plus this many - 1 made up

        def claim(i: int, s: RolloutSample) -> list[tuple[int, int]] | None:
            real = points(s)
            if real is None:
                return None
            return real + [(version + k, (k + 1) * SPAN_ALIGN) for k in range(1, extra)]

        return relabel(batch, claim)

    def _honest(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._build(lease, backend)

    def _stale_policy(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        batch = self._build(lease, backend)  # with the weights it never reloaded: its version is old
        if self.behaviour == "mixed":  # current weights, but claims a version older than the lease allows
            return batch.model_copy(update={"policy_version": lease.min_policy_version - 1})
        return batch

    def _changed_prompt(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        plan = [PlannedTask(t.task_id, edited_prompt(t.prompt_tokens), t.seeds) for t in plan_lease(lease, self.encode)]
        return self._build(lease, backend, plan)

    def _inflated_rewards(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return inflated(self._build(lease, backend))

    def _unassigned_tasks(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return self._build(lease, backend, self._unassigned(lease))

    def _garbage(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return garbled(self._build(lease, backend))

    def _other_weights(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        if self._other is None:
            self._other = perturbed_copy(backend)
        batch = self._build(lease, self._other)
        return batch.model_copy(update={"policy_version": backend.policy_version})

    def _fabricated_completion(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        return fabricated_batch(lease, backend, encode=self.encode, score=self.score)

    def _unassigned(self, lease: TaskLease) -> list[PlannedTask]:
        assigned = {t.task_id for t in lease.tasks}
        free = [t for t in range(self.num_tasks) if t not in assigned]
        plan = []
        for original, task_id in zip(lease.tasks, free, strict=False):  # the lease's seeds, other tasks
            plan.append(PlannedTask(task_id, tuple(self.prompt_tokens(task_id)), tuple(original.sampling_seeds)))
        return plan
