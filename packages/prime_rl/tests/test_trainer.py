"""Trainer: packed loss equals a naive per-sequence oracle, micro-batch invariance, checkpoints, a real step."""

from __future__ import annotations

import base64
import dataclasses
import socket
from pathlib import Path

import pytest
import torch
from tiny_lm import make_tiny_lm

import grpo
import shardcast
from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import RolloutBatch, RolloutSample, Verdict, VerdictRequest
from prime_rl.config import ConfigError, load_config
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet
from prime_rl.trainer.batching import make_micro_batches, split_minibatches
from prime_rl.trainer.checkpoint import TrainerState, latest_step, load_checkpoint, save_checkpoint
from prime_rl.trainer.process import Trainer
from prime_rl.trainer.step import old_logprobs_for, train_minibatch, warmup_lambda
from prime_rl.weights.files import load_policy_into

CPU = torch.device("cpu")


def naive_intellect2_loss(model, samples, constant):
    """Oracle: each sequence alone (no packing). At the first update ratio = 1 in value, so the
    INTELLECT-2 per-token loss is -A·r (clipping inactive, grad -A) minus 0.001·entropy, summed and
    divided by (num_seqs · C)."""
    total = 0.0
    for s in samples:
        ids = torch.tensor([s.prompt_tokens + s.completion_tokens])
        p, c = len(s.prompt_tokens), len(s.completion_tokens)
        logits = model(input_ids=ids).logits[0, p - 1 : p + c - 1].float()
        logp = (
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.completion_tokens)[:, None]).squeeze(-1)
        )
        entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
        ratio = torch.exp(logp - logp.detach())
        total = total + (-ratio * s.advantage - 0.001 * entropy).sum()
    return total / (len(samples) * constant)


def cpu_step(model, opt, micro, old, loss_fn, *, constant=None, max_grad_norm=1e9, **kwargs):
    """``train_minibatch`` as every test here runs it: temperature 1, on the CPU (no clipping unless
    ``max_grad_norm`` says so)."""
    return train_minibatch(
        model, opt, micro, old, loss_fn, temperature=1.0, constant=constant, max_grad_norm=max_grad_norm, device=CPU,
        **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("micro_batch_tokens", [10_000, 24, 12])
def test_packed_step_equals_naive_oracle(micro_batch_tokens, random_samples):
    samples = random_samples(8)
    model = make_tiny_lm().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    micro = make_micro_batches(samples, micro_batch_tokens)
    assert sum(m.num_sequences for m in micro) == 8
    old = old_logprobs_for(model, micro, 1.0, CPU)
    metrics = cpu_step(model, opt, micro, old, grpo.Loss("intellect2"), constant=8.0)
    packed_grads = [p.grad.clone() for p in model.parameters()]
    reference = make_tiny_lm().train()
    loss = naive_intellect2_loss(reference, samples, 8.0)
    loss.backward()
    assert metrics.loss == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    for mine, ref in zip(packed_grads, (p.grad for p in reference.parameters()), strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-6)
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-6) and metrics.num_sequences == 8


def test_split_minibatches_keeps_groups_whole(random_samples):
    samples = random_samples(12, group_size=4)
    parts = split_minibatches(samples, 2, 4)
    assert [len(p) for p in parts] == [8, 4]
    assert [s.sample_id for p in parts for s in p] == [s.sample_id for s in samples]
    assert len(split_minibatches(samples, 10, 4)) == 3


def test_warmup_schedule():
    f = warmup_lambda(4)
    assert [f(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lambda(0)(0) == 1.0


def test_loss_overrides_and_bad_recipe():
    cfg = load_config(None, ["--trainer.loss.recipe", "dapo", "--trainer.loss.eps_high", "0.3"]).trainer
    assert cfg.loss == dataclasses.replace(grpo.RECIPES["dapo"], eps_high=0.3)
    assert grpo.Loss(cfg.loss).config.eps_high == 0.3
    assert load_config(None).trainer.loss == grpo.RECIPES["intellect2"]  # the default recipe
    # grpo's own validation, at load time: unknown recipe, unknown field, out-of-range value
    with pytest.raises(ConfigError, match="unknown recipe 'nope'"):
        load_config(None, ["--trainer.loss.recipe", "nope"])
    with pytest.raises(ConfigError, match=r"unknown LossConfig fields \['delt'\]"):
        load_config(None, ["--trainer.loss.delt", "4"])
    with pytest.raises(ConfigError, match="delta must be > 1 \\+ eps_high"):
        load_config(None, ["--trainer.loss.delta", "1.1"])
    with pytest.raises(ConfigError, match=r"\[trainer.loss\] table, not in \[trainer\]: delta"):
        load_config(None, ["--trainer.delta", "4"])  # the old flat key says where it moved


def test_checkpoint_roundtrip_resumes_identically(tmp_path, random_samples):
    samples = random_samples(8)
    micro = make_micro_batches(samples, 64)

    def fresh():
        model = make_tiny_lm().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, opt

    def step(model, opt):
        old = old_logprobs_for(model, micro, 1.0, CPU)
        return cpu_step(model, opt, micro, old, grpo.Loss("dapo"), max_grad_norm=1.0)

    model, opt = fresh()
    step(model, opt)
    save_checkpoint(tmp_path, model, opt, TrainerState(step=1, scheduler={"last_epoch": 1}))
    (tmp_path / "step_2").mkdir()  # an incomplete checkpoint (no COMPLETE marker) is ignored
    expected = step(model, opt)
    assert latest_step(tmp_path) == 1
    model2, opt2 = fresh()
    state = load_checkpoint(tmp_path, model2, opt2)
    assert state == TrainerState(step=1, scheduler={"last_epoch": 1})
    resumed = step(model2, opt2)
    assert resumed.loss == pytest.approx(expected.loss, rel=1e-6)
    assert resumed.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- a real trainer step


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def submit_accepted(client: OrchestratorClient, admin: OrchestratorClient, worker_id: str) -> None:
    """One lease answered with fake (but in-vocabulary) rollouts, all accepted by a fake validator."""
    lease = client.get_tasks(worker_id)
    samples = []
    for task in lease.tasks:
        for g, seed in enumerate(task.sampling_seeds):
            samples.append(
                RolloutSample(
                    task_id=task.task_id, group_index=g, prompt_tokens=[5, 6, 7], completion_tokens=[8 + g, 9],
                    sampling_seed=seed, temperature=lease.temperature, reward=float(g == 0),
                    advantage=1.0 if g == 0 else -1.0, proofs=base64.b64encode(b"\0" * 130).decode(),
                    inference_logprobs=[-2.0, -2.0],
                )
            )  # fmt: skip
    batch = RolloutBatch(
        worker_id=worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=0, samples=samples
    )
    client.submit_rollouts(batch)
    for pending in admin.pending(8).batches:
        verdicts = [
            Verdict(
                sample_index=i,
                accepted=True,
                reason="ok",
                reward=s.reward,
                advantage=s.advantage,
                logprobs=[-1.5] * len(s.completion_tokens),  # the validator's: the trainer's only source
            )
            for i, s in enumerate(pending.samples)
        ]
        admin.post_verdicts(VerdictRequest(batch_id=pending.batch_id, verdicts=verdicts))


def trainer_config(tmp_path: Path, tiny_lm_dir: Path, port: int, origin_port: int, total_steps: int):
    return load_config(
        None,
        [
            "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir),
            "--orchestrator.port", str(port), "--orchestrator.prompts_per_batch", "2",
            "--orchestrator.async_level", "1", "--sampling.group_size", "2", "--sampling.max_new_tokens", "4",
            "--shardcast.origin_port", str(origin_port), "--shardcast.relay_ports", "[]",
            "--trainer.samples_per_step", "4", "--trainer.total_steps", str(total_steps),
            "--trainer.optimizer_steps_per_version", "2", "--trainer.lr", "1e-3",
            "--trainer.wait_log_every_s", "0.2", "--trainer.poll_interval_s", "0.05",
            "--orchestrator.release_after_tokens", "0",  # one fake worker: nothing would release its batches
        ],
    )  # fmt: skip


def test_trainer_trains_publishes_commits_and_resumes(tmp_path, tiny_lm_dir):
    port, origin_port = free_port(), free_port()
    config = trainer_config(tmp_path, tiny_lm_dir, port, origin_port, total_steps=1)
    tasks = TaskSet([{"prompt": f"{i}+1=", "task_type": "arithmetic"} for i in range(10)])
    with OrchestratorServer(config, tasks) as server, OrchestratorClient(server.url) as client:
        admin = OrchestratorClient(server.url, admin_token=server.admin_token)
        worker_id = client.register("fake").worker_id
        submit_accepted(client, admin, worker_id)
        trainer = Trainer(config)
        initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        try:
            trainer.run_loop()
        finally:
            trainer.close()
        assert (client.status().step, client.status().policy_version) == (1, 1)
        run = tmp_path / "run"
        policy = run / "policies" / "v1" / "model.safetensors"
        assert policy.is_file() and latest_step(run / "checkpoints") == 1
        assert (run / "shardcast" / "origin").is_dir()
        published = make_tiny_lm()
        load_policy_into(published, policy)
        assert any(not torch.equal(v, initial[k]) for k, v in published.state_dict().items())

        # Restart: the new trainer resumes from the step-1 checkpoint (weights equal to v1), waits for
        # step-1 data, trains on it and commits step 1 -> policy v2.
        trainer2 = Trainer(trainer_config(tmp_path, tiny_lm_dir, port, origin_port, total_steps=2))
        trainer2.resume()
        assert trainer2.step == 1
        for name, value in published.state_dict().items():
            torch.testing.assert_close(trainer2.model.state_dict()[name], value, rtol=0, atol=0)
        submit_accepted(client, admin, worker_id)
        try:
            samples = trainer2.wait_for_batch()
            assert len(samples) == 4 and all(s.policy_version == 0 for s in samples)
            assert all(s.behaviour_logprobs == [-1.5, -1.5] for s in samples)  # never the claimed -2.0
            trainer2.train_step(samples)
            trainer2.finish_step(samples)
        finally:
            trainer2.close()
        assert client.status().step == 2
        assert (run / "policies" / "v2" / "model.safetensors").is_file()
        # [shardcast] delta (default on): v2 also went out as deltas against v1
        origin = shardcast.DataDir(run / "shardcast" / "origin")
        manifest = shardcast.parse_manifest(origin.manifest_path(2).read_bytes())
        assert manifest.delta is not None and manifest.delta.base_version == 1
        admin.close()


def test_is_correction_inference_old_logprobs_and_kl_reference(random_samples):
    # Recomputed old log-probs (ratio 1) with fake inference log-probs of -1 per token: the engine
    # mismatch is large, so the mismatch KL is logged and the token-truncated IS weight π_old/μ is
    # active. The grpo recipe's KL term needs reference log-probs (an identical frozen copy here).
    samples = random_samples(8)
    micro = make_micro_batches(samples, 32)
    model = make_tiny_lm().train()
    reference = make_tiny_lm().eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    refs = old_logprobs_for(reference, micro, 1.0, CPU)
    old = old_logprobs_for(model, micro, 1.0, CPU)
    loss_fn = grpo.Loss("grpo", is_correction="token_truncate", is_threshold=2.0)
    metrics = cpu_step(model, opt, micro, old, loss_fn, ref_logprobs=refs)
    assert metrics.mismatch_kl is not None and metrics.mismatch_kl > 0.1
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-6)
    assert metrics.grad_norm > 0 and all(torch.isfinite(p.grad).all() for p in model.parameters())
    # old = the inference log-probs (no recompute): the ratio itself is π/μ, far from 1.
    direct = cpu_step(model, opt, micro, None, grpo.Loss("dapo"))
    assert direct.mean_ratio < 0.5 and direct.mismatch_kl == 0.0
    with pytest.raises(ValueError):
        load_config(
            None, ["--trainer.old_logprobs", "inference", "--trainer.loss.is_correction", "token_mask"]
        )
