"""Every role's tensor path keeps its tensors on the compute device.

On a GPU, a tensor built from Python data on the host and handed to an op with CUDA tensors
crashes ("Expected all tensors to be on the same device"): the validator's checks and the
trainer's full-logits head did exactly that on an H200. CPU CI cannot see it, so these tests run
each path under ``device_guard.simulated_device`` (a second device simulated on the CPU, with
real data) and, where CUDA exists, for real (``cuda`` marker).
"""

from __future__ import annotations

import pytest
import torch
from device_guard import MixedDevices, simulated_device
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.protocol import PendingBatch, TrainSample
from prime_rl.inference.backend import HFBackend, token_logprobs
from prime_rl.trainer.batching import make_micro_batches
from prime_rl.trainer.forward import completion_forward
from prime_rl.validator.checks import Reason
from prime_rl.validator.verdicts import validate_batch

KEY = b"device-paths-assignment-key"
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}*{t + 7}=", 8, group_size=2, prompts_per_batch=2, max_new_tokens=40)
SAMPLES = 4  # a batch: 2 prompts x a group of 2, one verdict each
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_the_guard_raises_where_cuda_would():
    logits = torch.randn(4, 10)
    with simulated_device() as device:
        device.place(logits)
        with pytest.raises(MixedDevices, match="same device"):
            logits.gather(-1, torch.tensor([[1], [2], [3], [4]]))
        ok = logits.gather(-1, torch.tensor([[1], [2], [3], [4]], device=logits.device))
        assert device.on_device(ok) and not device.on_device(ok.cpu())
        assert device.on_device(logits[torch.tensor([0, 2])])  # CUDA takes host index tensors
        assert device.on_device(logits * torch.tensor(2.0))  # and host scalars


def _validate(backend: HFBackend, step: int = 0) -> list[str]:
    lease, record = RUN.lease("device-worker", step, 0)
    batch = RUN.worker("honest").answer(lease, backend)
    pending = PendingBatch(
        batch_id="device-batch",
        worker_id=batch.worker_id,
        step=batch.step,
        batch_index=batch.batch_index,
        policy_version=batch.policy_version,
        received_at=0.0,
        lease=record,
        samples=batch.samples,
    )
    verdicts = validate_batch(
        pending, tasks=RUN, backend_for=lambda v: backend, decode=RUN.decode, checks=RUN.checks()
    )
    return [v.reason for v in verdicts]


def test_worker_and_validator_keep_tensors_on_the_compute_device():
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)
    with simulated_device() as device:
        device.place(backend.model)
        reasons = _validate(backend)
    # A host tensor mixed in anywhere would surface as internal_error verdicts (or raise); every
    # sample gets its verdict (an empty list must not pass).
    assert reasons == [Reason.ACCEPTED] * SAMPLES


def _samples() -> list[TrainSample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i, (prompt, completion) in enumerate([(5, 7), (3, 12), (9, 4)]):
        tokens = torch.randint(3, 100, (prompt + completion,), generator=gen).tolist()
        out.append(
            TrainSample(
                sample_id=f"b/{i}",
                batch_id="b",
                worker_id="w",
                task_id=i,
                group_index=0,
                policy_version=0,
                prompt_tokens=tokens[:prompt],
                completion_tokens=tokens[prompt:],
                behaviour_logprobs=[-1.0] * completion,
                temperature=1.0,
                reward=0.0,
                advantage=float(i) - 1.0,
            )
        )
    return out


@pytest.mark.parametrize("fused", [True, False], ids=["chunked_head", "full_logits"])
def test_trainer_forward_keeps_tensors_on_the_compute_device(fused):
    model = make_tiny_lm()
    (micro,) = make_micro_batches(_samples(), max_tokens=64)
    expected = completion_forward(model, micro, torch.device("cpu"), 1.0, entropy=True, fused=fused)
    with simulated_device() as device:
        device.place(model)
        got = completion_forward(model, micro, torch.device("cpu"), 1.0, entropy=True, fused=fused)
        assert device.on_device(got.logprobs)
    torch.testing.assert_close(got.logprobs, expected.logprobs, rtol=0, atol=0)
    assert got.entropy is not None and expected.entropy is not None
    torch.testing.assert_close(got.entropy, expected.entropy, rtol=0, atol=0)


def test_token_logprobs_takes_host_token_ids():
    logits = torch.randn(3, 10, dtype=torch.float64)
    with simulated_device() as device:
        device.place(logits)
        got = token_logprobs(logits, torch.tensor([1, 2, 3]), 1.0)
    want = torch.log_softmax(logits.float(), -1)[torch.arange(3), torch.tensor([1, 2, 3])]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.cuda
@CUDA
def test_worker_and_validator_on_cuda():
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER, device="cuda")
    reasons = _validate(backend)
    assert reasons == [Reason.ACCEPTED] * SAMPLES


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("fused", [True, False], ids=["chunked_head", "full_logits"])
def test_trainer_forward_on_cuda_matches_cpu(fused):
    model = make_tiny_lm()
    (micro,) = make_micro_batches(_samples(), max_tokens=64)
    expected = completion_forward(model, micro, torch.device("cpu"), 1.0, fused=fused)
    got = completion_forward(model.to("cuda"), micro, torch.device("cuda"), 1.0, fused=fused)
    assert got.logprobs.device.type == "cuda"
    torch.testing.assert_close(got.logprobs.cpu(), expected.logprobs, rtol=1e-4, atol=1e-4)
