"""The trusted validator (``prime-rl validator``).

Owns: the per-sample checks (``checks.py``: prompt, seed, termination, proofs, sampling,
log-probs, reward; pure over a backend), the batch around them (``verdicts.py``: lease, version,
coverage, groups, advantages; ``structure.py``: the checks that need no model), per-worker
evidence (``evidence.py``), the honest-noise profile (``noise.py``, cached per model, engine and machine
by ``noise_cache.py``, the model known by ``model_fingerprint.py``) and the process that pulls
pending batches, judges them with one prefill and posts verdicts (``process.py``). May import: ``config``, ``api``,
``inference``, ``weights``, ``tasks``, ``reward``, ``role``, ``metrics``, ``devices``; never ``worker``, ``trainer`` or
``orchestrator``.
"""
