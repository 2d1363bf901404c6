"""Generation backends and the contract they share with the validator.

Owns: the backend contract (seeded toploc sampler, toploc proofs of the decode hidden states,
inference log-probs at the sampling temperature, in-place weight reload) and its transformers
implementation (``backend.py``). Used by the worker, the validator and the evaluator (the run's
tasks as token ids and rewards are ``prime_rl.reward``, next to ``prime_rl.tasks``). May import:
``config``, ``tasks``, ``weights``, ``devices``, torch, transformers, toploc, verifiers; never
``worker``, ``validator`` or ``trainer``.
"""
