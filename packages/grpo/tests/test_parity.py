"""Parity with TRL and verl: the same fixed inputs through grpo and through each peer's loss code.

For every variant (PPO clip, DAPO clip-higher, INTELLECT-2's δ, Dr.GRPO, CISPO, SAPO, GSPO, the
k3 KL) and both log-ratio spreads (normal; extreme, with tokens beyond ±20 and a GSPO sequence
beyond e^10) the loss and its gradient w.r.t. ℓ are compared in float64. A pair agrees when
both differ by at most 1e-7 relative (float32 precision; most pairs agree to 1e-12 and the README
shows each gap); the pairs in ``NORMAL_DEVIATES`` and ``EXTREME_DEVIATES`` are expected to
differ, each for the reason given there, and every other pair must agree. The peers are TRL's own
``GRPOTrainer._compute_loss`` and verl's ``core_algos`` (its code where installed, else the
transcription in parity_peers.py; see there why).

Two tables in packages/grpo/README.md are generated here: the parity results and the parameter
names (every :class:`grpo.LossConfig` field, TRL's and verl's name and default). The test fails
when either drifts; ``GRPO_WRITE_README=1 pytest packages/grpo/tests/test_parity.py`` rewrites them.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import parity_peers as peers
import pytest
import torch
from parity_peers import Batch, T, VerlActor, make_batch

import grpo

pytest.importorskip("trl")
from trl import GRPOConfig

README = Path(__file__).resolve().parents[1] / "README.md"
TOLERANCE = 1e-7  # relative to max(1, |peer value|): float32 precision
SPREADS = ("normal", "extreme")


@dataclass(frozen=True)
class Case:
    variant: str
    peer: str  # "TRL" or "verl"
    recipe: str
    overrides: dict[str, Any]
    peer_settings: str  # as shown in the README
    run_peer: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]

    @property
    def id(self) -> str:
        return f"{self.peer}-{self.variant}"

    @property
    def grpo_call(self) -> str:
        args = [f'"{self.recipe}"', *(f"{k}={v!r}" for k, v in self.overrides.items())]
        return f"`Loss({', '.join(args)})`"


def trl(**settings: Any) -> Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]:
    return lambda batch: peers.trl_loss(batch, **settings)


def verl(loss_mode: str, agg: str, **kwargs: Any) -> Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]:
    kl = {k: kwargs.pop(k) for k in ("kl_loss_coef",) if k in kwargs}
    actor = VerlActor(**kwargs)
    return lambda batch: peers.verl_loss(batch, loss_mode, agg, actor, **kl)


NO_KL = {"use_bias_correction_kl": False}  # only read when beta != 0
TRL_GSPO = (("loss_type", "grpo"), ("importance_sampling_level", "sequence"), ("epsilon", 3e-4), ("epsilon_high", 4e-4))
VERL_GSPO = VerlActor(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
CASES = [
    Case("PPO clip", "TRL", "grpo", {"kl_coef": 0.0}, 'loss_type="grpo"', trl(loss_type="grpo")),
    Case("DAPO clip-higher", "TRL", "dapo", {}, 'loss_type="dapo", epsilon_high=0.28',
         trl(loss_type="dapo", epsilon_high=0.28)),
    Case("INTELLECT-2 δ = 4", "TRL", "intellect2", {"entropy_coef": 0.0, "constant": T},
         f'loss_type="dr_grpo", delta=4, max_completion_length={T}',
         trl(loss_type="dr_grpo", delta=4.0, max_completion_length=T)),
    Case("Dr.GRPO", "TRL", "dr_grpo", {"constant": T}, f'loss_type="dr_grpo", max_completion_length={T}',
         trl(loss_type="dr_grpo", max_completion_length=T)),
    Case("CISPO", "TRL", "cispo", {}, 'loss_type="cispo", epsilon_high=5', trl(loss_type="cispo", epsilon_high=5.0)),
    Case("SAPO", "TRL", "sapo", {}, 'loss_type="sapo"', trl(loss_type="sapo")),
    Case("GSPO", "TRL", "gspo", {}, 'loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4',
         trl(**dict(TRL_GSPO))),
    Case("GRPO + k3 KL β = 0.04", "TRL", "grpo", {}, 'loss_type="grpo", beta=0.04, use_bias_correction_kl=False',
         trl(loss_type="grpo", beta=0.04, **NO_KL)),
    Case("GRPO + k3 KL, TRL's default bias correction", "TRL", "grpo", {}, 'loss_type="grpo", beta=0.04',
         trl(loss_type="grpo", beta=0.04)),
    Case("PPO clip (verl's default dual-clip c = 3)", "verl", "grpo", {"kl_coef": 0.0, "delta": 3.0},
         'vanilla, loss_agg_mode="seq-mean-token-mean"', verl("vanilla", "seq-mean-token-mean")),
    Case("DAPO clip-higher", "verl", "dapo", {"delta": 3.0}, 'vanilla, clip_ratio_high=0.28, loss_agg_mode="token-mean"',
         verl("vanilla", "token-mean", clip_ratio_high=0.28)),
    Case("INTELLECT-2 δ = 4", "verl", "intellect2", {"entropy_coef": 0.0, "constant": T},
         f'vanilla, clip_ratio_c=4, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor={T}',
         verl("vanilla", "seq-mean-token-sum-norm", clip_ratio_c=4.0, loss_scale_factor=T)),
    Case("Dr.GRPO", "verl", "dr_grpo", {"constant": T, "delta": 3.0},
         f'vanilla, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor={T}',
         verl("vanilla", "seq-mean-token-sum-norm", loss_scale_factor=T)),
    Case("CISPO (verl's default band)", "verl", "cispo", {"is_floor": 0.8, "is_cap": 1.2},
         'cispo, loss_agg_mode="token-mean"', verl("cispo", "token-mean")),
    Case("SAPO", "verl", "sapo", {}, "sapo", verl("sapo", "seq-mean-token-mean")),
    Case("GSPO", "verl", "gspo", {}, 'gspo, clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean"',
         lambda batch: peers.verl_loss(batch, "gspo", "seq-mean-token-mean", VERL_GSPO)),
    Case("GRPO + k3 KL β = 0.04", "verl", "grpo", {"delta": 3.0},
         'vanilla + use_kl_loss, kl_loss_coef=0.04, kl_loss_type="low_var_kl", loss_agg_mode="seq-mean-token-mean"',
         verl("vanilla", "seq-mean-token-mean", kl_loss_coef=0.04)),
]

# Expected disagreements, each with its reason (the README shows the numbers).
NORMAL_DEVIATES = {
    "TRL-GRPO + k3 KL, TRL's default bias correction": "TRL multiplies the KL by the ratio r, with its gradient",
}
EXTREME_DEVIATES = {
    "TRL-PPO clip": "TRL does not clamp log-ratios to ±20",
    "TRL-DAPO clip-higher": "TRL does not clamp log-ratios to ±20",
    "TRL-Dr.GRPO": "TRL does not clamp log-ratios to ±20",
    "TRL-GSPO": "TRL does not cap the sequence log-ratio at 10",
    "TRL-GRPO + k3 KL β = 0.04": "TRL clamps neither the log-ratios nor the KL's log-ratio to ±20",
    "TRL-GRPO + k3 KL, TRL's default bias correction": "both of the above",
    "verl-GRPO + k3 KL β = 0.04": "verl clamps each token's k3 to <= 10",
}


def grpo_loss(case: Case, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    loss_fn = grpo.Loss(case.recipe, **case.overrides)
    logprobs = batch.fresh()
    ref = batch.ref if loss_fn.config.kl_coef > 0 else None
    out = loss_fn(logprobs, batch.old, batch.advantages, batch.mask, ref_logprobs=ref)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out.loss.detach(), grad


@dataclass(frozen=True)
class Comparison:
    grpo_loss: float
    peer_loss: float
    loss_gap: float  # |Δ loss| / max(1, |peer loss|)
    grad_gap: float  # max |Δ grad| / max(1, max |peer grad|)

    @property
    def agrees(self) -> bool:
        return self.loss_gap <= TOLERANCE and self.grad_gap <= TOLERANCE


_RESULTS: dict[tuple[str, str], Comparison] = {}


def compare(case: Case, spread: str) -> Comparison:
    key = (case.id, spread)
    if key not in _RESULTS:
        batch = make_batch(spread)
        ours, our_grad = grpo_loss(case, batch)
        theirs, their_grad = case.run_peer(batch)
        _RESULTS[key] = Comparison(
            float(ours),
            float(theirs),
            abs(float(ours - theirs)) / max(1.0, abs(float(theirs))),
            float((our_grad - their_grad).abs().max()) / max(1.0, float(their_grad.abs().max())),
        )
    return _RESULTS[key]


@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parity(case: Case, spread: str) -> None:
    result = compare(case, spread)
    expected_to_deviate = case.id in (NORMAL_DEVIATES if spread == "normal" else EXTREME_DEVIATES)
    # A deviation at the normal spread persists at the extreme one.
    expected_to_deviate = expected_to_deviate or (spread == "extreme" and case.id in NORMAL_DEVIATES)
    assert result.agrees != expected_to_deviate, (case.id, spread, result)


def clamp_first_gspo(batch: Batch, eps_low: float = 3e-4, eps_high: float = 4e-4) -> float:
    """GSPO's loss with each token's log-ratio clamped to ±20 *before* the sequence mean (grpo's
    order before it adopted the peers'), for the README's comparison."""
    log_ratio = torch.where(batch.mask, batch.logprobs.detach() - batch.old, 0.0).clamp(-20, 20)
    s = torch.exp((log_ratio.sum(-1) / batch.mask.sum(-1)).clamp(max=10))
    adv = batch.advantages
    return float(torch.maximum(-s * adv, -s.clamp(1 - eps_low, 1 + eps_high) * adv).mean())


def gspo_order() -> dict[str, float]:
    """GSPO on rows 0-2 of the extreme batch (tokens beyond ±20, no sequence beyond the cap)."""
    batch = make_batch("extreme").rows(3)
    case = next(c for c in CASES if c.id == "TRL-GSPO")
    return {
        "grpo": float(grpo_loss(case, batch)[0]),
        "TRL": float(peers.trl_loss(batch, **dict(TRL_GSPO))[0]),
        "verl": float(peers.verl_loss(batch, "gspo", "seq-mean-token-mean", VERL_GSPO)[0]),
        "clamp first": clamp_first_gspo(batch),
    }


def test_gspo_averages_before_clamping() -> None:
    # Row 0 of the extreme batch: log-ratios (25, −30, 0.1, 3, −0.2, 22), mean 19.9/6 = 3.3167.
    # Clamping each token to ±20 first would give 22.9/6 = 3.8167, i.e. s = 45.4 instead of 27.6.
    batch = make_batch("extreme")
    mean = grpo.sequence_mean_log_ratio(batch.logprobs.detach(), batch.old, batch.mask)
    assert abs(float(mean[0]) - 19.9 / 6) < 1e-12
    assert abs(float(mean[3]) - 83.0 / 3) < 1e-12  # beyond GSPO's cap: the loss uses e^10 and no gradient
    losses = gspo_order()
    assert abs(losses["grpo"] - losses["TRL"]) <= 1e-12 and abs(losses["grpo"] - losses["verl"]) <= 1e-9
    assert abs(losses["clamp first"] - losses["grpo"]) > 0.05


# ---- the README tables ---------------------------------------------------------------------------


def _gap(value: float) -> str:
    return "≤ 1e-12" if value <= 1e-12 else f"{value:.1e}"


def parity_table() -> str:
    lines = [
        f"| variant | peer (TRL {peers.trl_version()} `GRPOTrainer._compute_loss`; verl {peers.VERL_VERSION} `core_algos`) | grpo | "
        "normal: Δ loss, Δ grad | extreme: Δ loss, Δ grad | extreme: grpo loss vs peer loss |",
        "|---|---|---|---|---|---|",
    ]
    for case in CASES:
        normal, extreme = compare(case, "normal"), compare(case, "extreme")
        values = "equal" if extreme.agrees else f"{extreme.grpo_loss:.6g} vs {extreme.peer_loss:.6g}"
        lines.append(
            f"| {case.variant} | {case.peer}: {case.peer_settings} | {case.grpo_call} | "
            f"{_gap(normal.loss_gap)}, {_gap(normal.grad_gap)} | {_gap(extreme.loss_gap)}, {_gap(extreme.grad_gap)} | "
            f"{values} |"
        )
    reasons = {**NORMAL_DEVIATES, **EXTREME_DEVIATES}
    lines.append("")
    lines.append("Deviations: " + "; ".join(f"{key.replace('-', ' ', 1)}: {why}" for key, why in reasons.items()) + ".")
    order = gspo_order()
    lines.append("")
    lines.append(
        "GSPO's clamp order, on rows 0-2 of the extreme batch (tokens beyond ±20, no sequence beyond the cap): "
        f"grpo {order['grpo']:.6g}, TRL {order['TRL']:.6g}, verl {order['verl']:.6g}; clamping each token to ±20 "
        f"before the sequence mean, as grpo did before, gives {order['clamp first']:.6g}."
    )
    return "\n".join(lines)


def _trl(name: str) -> str:
    default = GRPOConfig.__dataclass_fields__[name].default
    return f"`{name}` = {default!r}"


# grpo LossConfig field -> (TRL name = TRL default, verl name = verl 0.9.1 default, note).
PARAMETERS: dict[str, tuple[str, str, str]] = {
    "advantage": (
        f"{_trl('scale_rewards')}: `\"group\"` = group_zscore, `\"none\"` = group_center",
        '`algorithm.adv_estimator` = "gae"; `"grpo"` = group_zscore, with `norm_adv_by_std_in_grpo=False` group_center; `"rloo"`',
        "",
    ),
    "std_eps": ("1e-4, fixed", "1e-6, fixed (`compute_grpo_outcome_advantage`)", "added to the sample std"),
    "objective": (
        f"{_trl('loss_type')}: grpo/bnpo/dr_grpo/dapo = ppo_clip, cispo, sapo; gspo = `importance_sampling_level=\"sequence\"`",
        '`policy_loss.loss_mode` = "vanilla" (ppo_clip with dual-clip), "gspo", "cispo", "sapo"',
        "",
    ),
    "eps_low": (_trl("epsilon"), "`clip_ratio_low` = 0.2 (`clip_ratio` = 0.2)", "an offset from 1"),
    "eps_high": (f"{_trl('epsilon_high')} (None: `epsilon`)", "`clip_ratio_high` = 0.2", "an offset from 1; DAPO 0.28"),
    "delta": (
        _trl("delta"),
        "`clip_ratio_c` = 3.0, always applied by vanilla (Â < 0 only)",
        "verl's default is grpo `delta=3`; δ is inert for Â > 0 (δ > 1 + ε_high)",
    ),
    "is_cap": (
        f"{_trl('epsilon_high')} with `loss_type=\"cispo\"` (None: `epsilon`, a cap of 0.2)",
        "1 + `clip_ratio_high` (= 1.2)",
        "absolute; TRL's and verl's defaults differ from grpo's 5 (ScaleRL)",
    ),
    "is_floor": ("none (0)", "1 − `clip_ratio_low` (= 0.8)", "absolute"),
    "tau_pos": (_trl("sapo_temperature_pos"), "`tau_pos` = 1.0", ""),
    "tau_neg": (_trl("sapo_temperature_neg"), "`tau_neg` = 1.05", ""),
    "aggregation": (
        "by `loss_type`: grpo/sapo seq_mean_token_mean, bnpo/dapo/cispo token_mean, dr_grpo constant",
        '`loss_agg_mode` = "token-mean"; seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (= constant)',
        "TRL's dapo/cispo count the tokens of the whole accumulation window, grpo's `num_tokens`",
    ),
    "constant": (f"{_trl('max_completion_length')} (`dr_grpo`)", "`loss_scale_factor` = None (the padded response length)", ""),
    "kl_coef": (
        f"{_trl('beta')}",
        "`use_kl_loss` = False, `kl_loss_coef` = 0.001",
        '`Loss("grpo")` has 0.04 (DeepSeekMath); TRL and verl default to no KL',
    ),
    "kl_estimator": (
        f"k3, fixed; {_trl('use_bias_correction_kl')} multiplies it by r",
        '`kl_loss_type` = "low_var_kl" (k3, each token clamped to <= 10); "k1", "k2"',
        "",
    ),
    "entropy_coef": (_trl("entropy_coef"), "`entropy_coeff` = 0", "grpo adds −coef·H per token before aggregation"),
    "is_correction": (
        f"{_trl('vllm_importance_sampling_correction')}, {_trl('vllm_importance_sampling_mode')}",
        '`algorithm.rollout_correction` = None; `rollout_is` = "sequence" when set',
        "token_truncate, sequence_truncate, token_mask, sequence_mask in all three",
    ),
    "is_threshold": (_trl("vllm_importance_sampling_clip_max"), "`rollout_is_threshold` = 2.0", "TIS cap or the band's top"),
    "is_low": (_trl("vllm_importance_sampling_clip_min"), '`rollout_is_threshold` = "low_high" string', "the band's bottom"),
}


def parameter_table() -> str:
    lines = [
        f"| grpo `LossConfig` | grpo default | TRL {peers.trl_version()} `GRPOConfig` | verl {peers.VERL_VERSION} `actor_rollout_ref.actor` | note |",
        "|---|---|---|---|---|",
    ]
    for field in dataclasses.fields(grpo.LossConfig):
        trl_name, verl_name, note = PARAMETERS[field.name]
        lines.append(f"| `{field.name}` | {field.default!r} | {trl_name} | {verl_name} | {note} |")
    return "\n".join(lines)


def test_every_loss_config_field_has_a_row() -> None:
    assert [f.name for f in dataclasses.fields(grpo.LossConfig)] == list(PARAMETERS)


@pytest.mark.parametrize(("name", "table"), [("parity", parity_table), ("parameters", parameter_table)])
def test_readme_tables_are_current(name: str, table: Callable[[], str]) -> None:
    text = README.read_text()
    pattern = re.compile(rf"(<!-- {name}-table: generated by tests/test_parity.py -->\n)(.*?)(\n<!-- /{name}-table -->)", re.S)
    match = pattern.search(text)
    assert match, f"README.md lacks the {name} table markers"
    current = table()
    if os.environ.get("GRPO_WRITE_README") == "1":
        README.write_text(pattern.sub(lambda m: m.group(1) + current + m.group(3), text))
    else:
        assert match.group(2) == current, f"the {name} table drifted: GRPO_WRITE_README=1 pytest {__file__}"
