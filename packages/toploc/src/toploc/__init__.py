"""Verifiable inference proofs (TOPLOC): 258-byte commitments to an LLM's hidden states, checked with one prefill."""

from toploc.errors import ActivationError, ProofFormatError
from toploc.evidence import EvidencePolicy, EvidenceState, EvidenceTests, WorkerEvidence
from toploc.noise import EvidenceError, NoiseProfile, Observations, StatisticNoise
from toploc.proofs import (
    build_proofs,
    build_proofs_base64,
    build_proofs_bytes,
    verify_proofs,
    verify_proofs_base64,
    verify_proofs_bytes,
)
from toploc.results import Thresholds, Verdict, VerificationResult
from toploc.sampling import SamplingCheck, check_sampling, gumbel_noise, sample_tokens, sampling_margins
from toploc.streaming import ProofBuilder, split_proofs
from toploc.wire import ProofPoly

__version__ = "0.2.0"

from toploc._name_clash import warn_on_name_clash as _warn_on_name_clash

_warn_on_name_clash("toploc", "intellect2-toploc", others_hint="the reference implementation `toploc` 0.1.x on PyPI")

__all__ = [
    "ActivationError",
    "EvidenceError",
    "EvidencePolicy",
    "EvidenceState",
    "EvidenceTests",
    "NoiseProfile",
    "Observations",
    "ProofBuilder",
    "ProofFormatError",
    "ProofPoly",
    "SamplingCheck",
    "StatisticNoise",
    "Thresholds",
    "Verdict",
    "VerificationResult",
    "WorkerEvidence",
    "__version__",
    "build_proofs",
    "build_proofs_base64",
    "build_proofs_bytes",
    "check_sampling",
    "gumbel_noise",
    "sample_tokens",
    "sampling_margins",
    "split_proofs",
    "verify_proofs",
    "verify_proofs_base64",
    "verify_proofs_bytes",
]
