"""Verifiable inference proofs (TOPLOC): 258-byte commitments to an LLM's hidden states, checked with one prefill."""

__version__ = "0.2.0"

__all__ = ["__version__"]
