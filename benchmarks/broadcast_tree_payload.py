"""The broadcast payload of benchmarks/broadcast_tree.py: consecutive bf16 checkpoints of a
Qwen2-shaped model, one real AdamW step apart.

- The model is built in code (`transformers.Qwen2Config`, no hub): Qwen2's vocabulary (151,936)
  and tied embeddings, a narrow trunk, so that the bf16 safetensors file is about 64 MB
  (`hidden=192, layers=6`: 33.4 M parameters, 66.8 MB).
- Weights are kept in fp32 (a trainer's master weights) and each version is written as the bf16
  `save_file` a trainer publishes, so a delta between versions is what rounding to bf16 keeps of
  one optimizer step.
- A step is `torch.optim.AdamW` (weight decay 0.01, PyTorch's default) on the causal-LM loss of
  one fixed batch of `batch x sequence` token ids drawn uniformly from the vocabulary with a seed
  (no tokenizer offline). Pitfall: only embedding rows of tokens in the batch get a gradient, as
  in RL where a batch covers a small part of the vocabulary; weight decay alone moves a bf16
  weight only at large lr.

Versions are cached under `cache_dir/<key>/` (key: every argument), so the grid of runs and the
test build them once.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

FILE_NAME = "model.safetensors"


@dataclass(frozen=True)
class PayloadSpec:
    """Which checkpoints to build: the model's shape, the optimizer step and how many versions."""

    hidden: int = 192  # hidden size; head_dim 64 (hidden / heads)
    layers: int = 6
    vocab: int = 151_936  # Qwen2's
    lr: float = 3e-7  # INTELLECT-2's learning rate
    versions: int = 4  # version 1 is the initial model, each later one is one AdamW step on
    batch: int = 8
    sequence: int = 128
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Payload:
    """Built versions: `paths[k]` is version k + 1; sha256 of each file; parameter count."""

    spec: PayloadSpec
    paths: tuple[Path, ...]
    sha256: tuple[str, ...]
    parameters: int

    @property
    def size(self) -> int:
        return self.paths[0].stat().st_size


def build(spec: PayloadSpec, cache_dir: Path) -> Payload:
    """Write (or reuse) `spec.versions` bf16 checkpoints under `cache_dir/<spec.key()>/`."""
    directory = cache_dir / spec.key()
    record = directory / "payload.json"
    if record.exists():
        saved = json.loads(record.read_text())
        paths = tuple(directory / f"v{k + 1}.safetensors" for k in range(spec.versions))
        if all(path.exists() for path in paths):
            return Payload(spec, paths, tuple(saved["sha256"]), saved["parameters"])
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 16 // 3,  # Qwen2-0.5B's ratio (896 -> 4864) rounded
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.hidden // 64,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        max_position_embeddings=spec.sequence,
    )
    model = Qwen2ForCausalLM(config)  # fp32 master weights, as a trainer keeps them
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    tokens = torch.randint(
        0, spec.vocab, (spec.batch, spec.sequence), generator=torch.Generator().manual_seed(spec.seed)
    )
    paths, digests = [], []
    for number in range(1, spec.versions + 1):
        if number > 1:
            optimizer.zero_grad()
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
        # lm_head.weight is the embedding (tied): stored once, as Qwen2's own checkpoints do
        state = {
            name: value.detach().to(torch.bfloat16).contiguous()
            for name, value in model.state_dict().items()
            if name != "lm_head.weight"
        }
        path = directory / f"v{number}.safetensors"
        save_file(state, str(path), metadata={"format": "pt"})
        paths.append(path)
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    parameters = sum(p.numel() for p in model.parameters())
    record.write_text(json.dumps({"spec": asdict(spec), "sha256": digests, "parameters": parameters}))
    return Payload(spec, tuple(paths), tuple(digests), parameters)


@dataclass(frozen=True)
class DeltaSize:
    """One version as published with `delta=True`: full file bytes against delta bytes on the wire."""

    version: int
    file_bytes: int
    delta_bytes: int | None  # None for version 1 (no base)
    changed_elements: float | None  # share of bf16 elements that differ from the previous version


def delta_sizes(payload: Payload, shard_size: int) -> list[DeltaSize]:
    """Publish every version into a scratch origin with `delta=True` and read the delta sizes off the manifests."""
    import torch
    from safetensors.torch import load_file

    from shardcast import publish_file

    rows = []
    with tempfile.TemporaryDirectory(prefix="broadcast-delta-") as scratch:
        previous = None
        for number, path in enumerate(payload.paths, start=1):
            manifest = publish_file(scratch, path, delta=True, shard_size=shard_size, file_name=FILE_NAME)
            current = load_file(str(path))
            changed = None
            if previous is not None:
                differ = sum(
                    int((previous[k].view(torch.int16) != current[k].view(torch.int16)).sum())
                    for k in current
                )
                changed = differ / sum(t.numel() for t in current.values())
            delta = None if manifest.delta is None else sum(d.stored_size for d in manifest.delta.shards)
            rows.append(DeltaSize(number, manifest.file_size, delta, changed))
            previous = current
    return rows
