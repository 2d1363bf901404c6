"""Exception types of the toploc package.

Every error raised on purpose by this package is one of these, so a validator can
catch exactly "the untrusted input was bad" without swallowing programming errors.
"""

from __future__ import annotations


class ProofFormatError(ValueError):
    """A proof (bytes, base64 text or list of proofs) is malformed.

    Raised for wrong lengths, a modulus outside 1..65497 (0 is the reference's null
    proof), coefficients >= 65497, non-canonical base64, or a proof count that does
    not match the number of chunks the activations make.
    """


class ActivationError(ValueError):
    """Activations cannot be proven or verified as given.

    Raised for NaN/Inf values, integer dtypes, wrong ranks, ragged rows, or chunks
    with fewer elements than ``topk``.
    """
