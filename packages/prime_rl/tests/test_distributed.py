"""FSDP2 data parallelism: 2 CPU ranks on gloo give the loss and gradient norm of 1 rank on the same batch,
and the same steps exactly with the decoder layers checkpointed (recomputed in backward).

Each configuration runs under a real ``torchrun`` subprocess (exit code checked); rank 0 writes the
step's metrics and a digest of the updated weights as JSON.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, {support!r})
    from tiny_lm import make_tiny_lm
    import grpo
    from prime_rl.trainer import distributed
    from prime_rl.trainer.batching import make_micro_batches
    from prime_rl.trainer.step import old_logprobs_for, rank_share, train_minibatch
    from prime_rl.api.protocol import TrainSample

    torch.set_num_threads(1)
    distributed.init_distributed()
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(10):
        p = torch.randint(3, 100, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 100, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        samples.append(TrainSample(sample_id=f"b/{{i}}", batch_id="b", worker_id="w", task_id=i // 2,
            group_index=i % 2, policy_version=0, prompt_tokens=p, completion_tokens=c,
            behaviour_logprobs=[-3.0] * len(c), temperature=1.0, reward=float(i % 2), advantage=float((-1) ** i)))
    model = make_tiny_lm().train()
    if {checkpointing}:
        grpo.enable_activation_checkpointing(model)
    layer_calls = [0]
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args: layer_calls.__setitem__(0, layer_calls[0] + 1))
    distributed.shard_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # 3 rows of packed micro-batches: with 2 ranks one rank also runs an all-masked padding row.
    share = rank_share(make_micro_batches(samples, {micro_tokens}))
    results = []
    for step in range(2):
        old = old_logprobs_for(model, share, 1.0, torch.device("cpu"))
        m = train_minibatch(model, opt, share, old, grpo.Loss("intellect2"), temperature=1.0, constant=6.0,
                            max_grad_norm=0.5, device=torch.device("cpu"))
        results.append({{"loss": m.loss, "grad_norm": m.grad_norm, "tokens": m.num_tokens, "seqs": m.num_sequences}})
    state = distributed.full_state_dict(model)
    if distributed.rank() == 0:
        digest = {{k: [float(v.double().sum()), float(v.double().abs().sum())] for k, v in state.items()}}
        json.dump({{"steps": results, "digest": digest, "world": distributed.world_size(), "layer_calls": layer_calls[0]}},
                  open(sys.argv[1], "w"))
    print(f"rank {{distributed.rank()}}: steps done, shutting down", file=sys.stderr, flush=True)
    distributed.shutdown_distributed()
    print("shut down", file=sys.stderr, flush=True)  # (an abort after this line is in interpreter teardown)
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_torchrun(tmp_path: Path, nproc: int, micro_tokens: int, checkpointing: bool = False) -> dict:
    script = tmp_path / "fsdp_step.py"
    support = str(Path(__file__).resolve().parents[3] / "tests" / "support")
    script.write_text(SCRIPT.format(support=support, micro_tokens=micro_tokens, checkpointing=checkpointing))
    out = tmp_path / f"result_{nproc}{'_checkpointed' if checkpointing else ''}.json"
    # PYTHONFAULTHANDLER: a rank that aborts (SIGABRT, "terminate called without an active exception",
    # 2 of about 8 full-suite runs, never alone) prints every thread's Python stack, so the next one
    # shows which thread and what it was doing.
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONFAULTHANDLER="1")
    argv = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}", "--master_addr=127.0.0.1", str(script), str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path):
    one = run_torchrun(tmp_path, 1, micro_tokens=40)
    two = run_torchrun(tmp_path, 2, micro_tokens=40)
    assert (one["world"], two["world"]) == (1, 2)
    for a, b in zip(one["steps"], two["steps"], strict=True):
        assert (a["tokens"], a["seqs"]) == (b["tokens"], b["seqs"]) == (a["tokens"], 10)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert one["steps"][0]["grad_norm"] > 0.5  # clipping was active, so clipping is compared too
    for name, (total, absolute) in one["digest"].items():
        other_total, other_abs = two["digest"][name]
        assert other_abs == pytest.approx(absolute, rel=1e-5), name
        assert other_total == pytest.approx(total, rel=1e-4, abs=1e-4), name


@pytest.mark.slow
def test_two_gloo_ranks_with_activation_checkpointing_match_without(tmp_path):
    # FSDP2 unshards a checkpointed layer again for its recompute in backward: the same steps, exactly.
    plain = run_torchrun(tmp_path, 2, micro_tokens=40)
    checkpointed = run_torchrun(tmp_path, 2, micro_tokens=40, checkpointing=True)
    assert checkpointed.pop("layer_calls") > plain.pop("layer_calls")  # the layers ran again in backward
    assert checkpointed == plain
