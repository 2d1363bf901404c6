"""The HTTP API between the orchestrator and everyone else: the contract both sides share.

Owns: the wire messages (``protocol.py``), the one HTTP client (``client.py``), the API's error
type (``errors.py``) and deterministic task assignment (``assignment.py``), which the orchestrator
uses to hand out leases and the validator uses to recompute them. May import: ``config``, pydantic,
requests; never torch, never a role room.
"""
