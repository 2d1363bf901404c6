"""Generation backends and the contract they share with the validator.

Owns: the backend contract (``contract.py``: seeded toploc sampler, toploc proofs of the decode
hidden states, inference log-probs at the sampling temperature, in-place weight reload), its
transformers implementation (``backend.py``, which finds stop strings with ``stop_strings.py`` and
decodes with the steps of ``decode_steps.py``),
its vLLM implementation (``vllm_backend.py``) and the choice between them (``select.py``). Used by the worker, the validator and the evaluator (the run's
tasks as token ids and rewards are ``prime_rl.reward``, next to ``prime_rl.tasks``). May import:
``config``, ``tasks``, ``weights``, ``devices``, torch, transformers, toploc, verifiers; never
``worker``, ``validator`` or ``trainer``.
"""
