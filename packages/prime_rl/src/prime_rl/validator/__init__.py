"""The trusted validator (``prime-rl validator``).

Owns: the per-sample checks (``checks.py``: assignment, prompt, proofs, sampling, log-probs,
rewards, advantages; pure over a backend) and the process that pulls pending batches, judges them
with one prefill and posts verdicts (``process.py``). May import: ``config``, ``api``,
``inference``, ``weights``, ``tasks``, ``metrics``; never ``worker``, ``trainer`` or
``orchestrator``.
"""
