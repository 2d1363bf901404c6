"""Verifiable inference proofs (TOPLOC): 258-byte commitments to an LLM's hidden states, checked with one prefill."""

from toploc.errors import ActivationError, ProofFormatError
from toploc.proofs import (
    build_proofs,
    build_proofs_base64,
    build_proofs_bytes,
    verify_proofs,
    verify_proofs_base64,
    verify_proofs_bytes,
)
from toploc.results import Thresholds, Verdict, VerificationResult
from toploc.wire import ProofPoly

__version__ = "0.2.0"

__all__ = [
    "ActivationError",
    "ProofFormatError",
    "ProofPoly",
    "Thresholds",
    "Verdict",
    "VerificationResult",
    "__version__",
    "build_proofs",
    "build_proofs_base64",
    "build_proofs_bytes",
    "verify_proofs",
    "verify_proofs_base64",
    "verify_proofs_bytes",
]
