"""Generation backends and the contract they share with the validator.

Owns: the backend contract (seeded toploc sampler, toploc proofs of the decode hidden states,
inference log-probs at the sampling temperature, in-place weight reload) and its transformers
implementation (``backend.py``), and the run's tasks as token ids and rewards (``run_tasks.py``).
Used by the worker, the validator and the evaluator. May import: ``config``, ``tasks``,
``weights``, ``devices``, torch, transformers, toploc, verifiers; never ``worker``, ``validator`` or ``trainer``.
"""
