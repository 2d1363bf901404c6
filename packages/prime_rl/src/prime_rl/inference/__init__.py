"""Generation backends and the contract they share with the validator.

Owns: the backend contract (``contract.py``: seeded toploc sampler, toploc proofs of the decode
hidden states, inference log-probs at the sampling temperature, in-place weight reload), its
transformers implementation (``backend.py``), its vLLM implementation (``vllm_backend.py``), the
choice between them (``select.py``), and the run's tasks as token ids and rewards (``run_tasks.py``).
Used by the worker, the validator and the evaluator. May import: ``config``, ``tasks``,
``weights``, ``devices``, torch, transformers, toploc, verifiers; never ``worker``, ``validator`` or ``trainer``.
"""
