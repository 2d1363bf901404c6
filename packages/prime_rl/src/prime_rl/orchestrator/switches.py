"""The rules of ``POST /leases/switch``: when a worker may switch its open lease to a newer version.

A worker decoding a lease announces an in-flight switch before it samples the new version's first
token: ``(lease, policy_version, chunk)``, the new version sampling from completion token
``32 * chunk`` on. The orchestrator records the *first* announcement per (lease, version) durably
and answers ``nonce = switch_nonce(key, lease, version, chunk)`` (``api/assignment.py``); every
token from the boundary on is sampled with ``span_seed(sample seed, nonce)``, which the worker
cannot know before it has fixed the chunk, and which the validator recomputes from the record.
So a worker cannot try several switch points and keep the best: it learns the noise of one cut
only, and the validator holds it to that cut (``docs/inflight.md`` section 4).

:func:`decide_switch` is pure: the ledger hands it the lease's record, whether the lease is open,
the newest committed version and the clock, and records what it returns if it is new. Refusals,
each with its own message:

* 409 ``conflict``: the version was announced at another chunk (the first stands); the lease is
  answered or expired; the version is not newer than the lease's current one (its start version
  or its last switch); switches are off (``max_versions_per_sample`` 1, the default); the lease has
  switched once already (:data:`MAX_SWITCHES_PER_LEASE`: at most one keep-or-reroll per lease,
  whatever version it was asked at; the config refuses switches without the mandatory switch and
  the speed cap, ``config/sections.py``).
* 422 ``bad_switch``: the version is not committed; the chunk is at or past ``max_new_tokens``
  (no token would be sampled by it: a no-op switch); the chunk lies beyond the speed cap
  ``32 c > max_tokens_per_s * (now - issued_at) + 32`` (part A of section 4: no worker can have
  decoded that far, so announcing it would only keep a tail it has already seen).

Episodes (a multi-turn run, ``tasks.environment`` not ``single_turn``): an episode lease switches
only at a model turn's start, so ``chunk`` is the model turn ``t >= 1`` it switches at, and every
episode still running at turn ``t`` draws turns ``t`` on with ``switched_turn_seed``
(``api/segments.py``). The rules are the same except the position's: ``t`` must be below the
environment's ``max_turns`` (a turn no episode plays would be a no-op switch; 422 ``bad_switch``),
where the orchestrator knows it (a built-in environment, ``tasks.environment.max_turns``; for a user
environment it does not load, no upper bound), and neither ``max_new_tokens`` nor the speed cap
applies (a turn is not a token count).

An identical retry (same version and chunk) answers the recorded switch again, whatever happened
to the lease since: the answer is the same nonce, so it tells the worker nothing new.

The mandatory switch (part A, ``orchestrator.switch_deadline_s`` > 0; :func:`mandatory_problem`):
for every version committed while a lease is open, the worker must, within the deadline, announce
a switch to it or a newer version, or declare the lease done (``POST /leases/done`` with the
digest of the batch it will submit, :func:`decide_done`), or have submitted. A batch that comes
later without either is refused, so its lease expires as abandoned; a batch that differs from its
declared digest, or whose longest sample is longer than ``max_decode_tokens_per_s`` lets a worker
decode by the declaration, is refused too. So a worker that has not finished by the deadline
cannot keep the no-switch continuation, and one that declares done fixes its batch.
"""

from __future__ import annotations

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import LeaseDone, LeaseRecord, LeaseSwitch
from prime_rl.api.spans import SPAN_ALIGN

__all__ = ["MAX_SWITCHES_PER_LEASE", "current_version", "decide_done", "decide_switch", "mandatory_problem"]

MAX_SWITCHES_PER_LEASE = 1
"""Every switch is one keep-or-reroll for a worker that decoded ahead (module docstring): a lease asked
at the window's oldest version (``GET /tasks?version=``) with two newer versions committed could
otherwise announce v+1 at chunk 1 and v+2 at chunk 2 after looking at each tail, three draws where
the design allows two. One switch bounds it whatever the asked version and the commits."""


def current_version(record: LeaseRecord) -> int:
    """The version a lease's running samples are sampled by now: its last switch's, else its own."""
    return record.switches[-1].policy_version if record.switches else record.fixed_version


def decide_switch(
    record: LeaseRecord,
    *,
    is_open: bool,
    policy_version: int,
    chunk: int,
    committed: int,
    now: float,
    max_versions: int,
    max_new_tokens: int,
    max_tokens_per_s: float,
    max_turns: int | None = None,
) -> LeaseSwitch:
    """The switch to answer with: the recorded one for an identical retry, else a new one (the
    caller records it); ApiFailure for a refusal (module docstring).

    ``committed``: the newest committed policy version; ``now``: orchestrator unix time;
    ``max_versions``: ``orchestrator.max_versions_per_sample``; ``max_tokens_per_s``:
    ``orchestrator.max_decode_tokens_per_s`` (0: no speed cap); ``max_turns``: None in a single-turn
    run; in a multi-turn run ``chunk`` is a model turn, bounded by ``max_turns`` (0: unknown, unbounded).
    """
    for switch in record.switches:
        if switch.policy_version == policy_version:
            if switch.chunk == chunk:
                return switch
            raise ApiFailure(
                409, "conflict",
                f"version {policy_version} was announced for this lease at chunk {switch.chunk}; the first "
                "announcement stands (one switch point per version and lease)",
            )  # fmt: skip
    if not is_open:
        raise ApiFailure(409, "conflict", "the lease is answered or expired: a switch needs an open lease")
    if record.done is not None:
        raise ApiFailure(409, "conflict", "the lease was declared done: its samples are all decoded")
    current = current_version(record)
    if policy_version <= current:
        raise ApiFailure(
            409, "conflict", f"version {policy_version} is not newer than the lease's current version {current}"
        )
    if max_versions <= 1:
        raise ApiFailure(
            409, "conflict",
            "in-flight switches are off in this run (orchestrator.max_versions_per_sample = 1): decode the lease "
            "with its own version",
        )  # fmt: skip
    if len(record.switches) >= MAX_SWITCHES_PER_LEASE:
        raise ApiFailure(
            409, "conflict",
            f"the lease switched to v{record.switches[0].policy_version} at chunk {record.switches[0].chunk} already: "
            "a lease takes at most one switch (one keep-or-reroll, whatever version the lease was asked at)",
        )  # fmt: skip
    if record.switches and chunk <= record.switches[-1].chunk:
        raise ApiFailure(
            409, "conflict", f"chunk {chunk} is not after the last switch's chunk {record.switches[-1].chunk}"
        )
    if policy_version > committed:
        raise ApiFailure(
            422, "bad_switch", f"version {policy_version} is not committed: the newest committed version is {committed}"
        )
    if max_turns is not None:  # an episode lease: chunk is the model turn the switch starts
        if max_turns and chunk >= max_turns:
            raise ApiFailure(
                422, "bad_switch",
                f"model turn {chunk} is at or past the environment's max_turns {max_turns}: no episode plays it",
            )  # fmt: skip
        return LeaseSwitch(policy_version=policy_version, chunk=chunk, announced_at=now)
    if SPAN_ALIGN * chunk >= max_new_tokens:
        raise ApiFailure(
            422, "bad_switch",
            f"chunk {chunk} starts at token {SPAN_ALIGN * chunk}, at or past max_new_tokens {max_new_tokens}: "
            "no token of the lease would be sampled by the new version",
        )  # fmt: skip
    elapsed = max(0.0, now - record.issued_at)
    if max_tokens_per_s > 0 and SPAN_ALIGN * chunk > max_tokens_per_s * elapsed + SPAN_ALIGN:
        reachable = int((max_tokens_per_s * elapsed + SPAN_ALIGN) // SPAN_ALIGN)
        raise ApiFailure(
            422, "bad_switch",
            f"chunk {chunk} (token {SPAN_ALIGN * chunk}) is beyond what any worker can have decoded "
            f"{elapsed:.2f} s after the lease was issued at {max_tokens_per_s:g} tokens/s per sequence "
            f"(orchestrator.max_decode_tokens_per_s): at most chunk {reachable} now",
        )  # fmt: skip
    return LeaseSwitch(policy_version=policy_version, chunk=chunk, announced_at=now)


def decide_done(record: LeaseRecord, *, is_open: bool, digest: str, now: float) -> LeaseDone:
    """The done declaration to answer with: the recorded one for an identical retry, else a new one
    (the caller records it). 409 for another digest or a closed lease."""
    if record.done is not None:
        if record.done.digest == digest:
            return record.done
        raise ApiFailure(409, "conflict", "the lease was declared done with another digest; the first declaration stands")
    if not is_open:
        raise ApiFailure(409, "conflict", "the lease is answered or expired: done needs an open lease")
    return LeaseDone(digest=digest, declared_at=now)


def mandatory_problem(
    record: LeaseRecord,
    *,
    digest: str,
    longest: int,
    commit_times: dict[int, float],
    now: float,
    deadline_s: float,
    max_versions: int,
    max_tokens_per_s: float,
) -> str | None:
    """Why a batch (``digest``: ``api.spans.lease_digest`` of its samples; ``longest``: its longest
    completion, tokens) submitted at ``now`` breaks the mandatory switch rule (module docstring), or
    None. ``commit_times``: version -> orchestrator time it was committed; ``deadline_s``:
    ``orchestrator.switch_deadline_s`` (0: no rule)."""
    if deadline_s <= 0:
        return None
    done = record.done
    if done is not None:
        if digest != done.digest:
            return f"the batch differs from the digest declared done at {done.declared_at:.3f}"
        reachable = max_tokens_per_s * max(0.0, done.declared_at - record.issued_at) + SPAN_ALIGN
        if max_tokens_per_s > 0 and longest > reachable:
            return (
                f"a sample of {longest} tokens was declared done {done.declared_at - record.issued_at:.2f} s after "
                f"the lease was issued: more than {max_tokens_per_s:g} tokens/s per sequence can decode "
                "(orchestrator.max_decode_tokens_per_s)"
            )
    for version, committed_at in sorted(commit_times.items()):
        if version <= record.fixed_version or committed_at <= record.issued_at:
            continue
        due = committed_at + deadline_s
        if now <= due:
            continue  # submitted in time: the batch itself fixes the lease
        switched = [s for s in record.switches if s.announced_at <= due]
        if any(s.policy_version >= version for s in switched) or len(switched) >= min(MAX_SWITCHES_PER_LEASE, max_versions - 1):
            continue
        if done is not None and done.declared_at <= due:
            continue
        return (
            f"v{version} was committed at {committed_at:.3f} while the lease was open, and neither a switch to it "
            f"(or a newer version) nor done came within orchestrator.switch_deadline_s = {deadline_s:g} s; the "
            f"batch came at {now:.3f}: the lease is void"
        )
    return None
