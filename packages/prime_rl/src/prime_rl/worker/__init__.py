"""The untrusted inference worker (``prime-rl worker``).

Owns: the worker process (``process.py``: follow the policy, take leases, submit batches), turning
a lease into a rollout batch (``rollout.py``), and, beside the honest path and never on it, the
red-team behaviours used by tests and demos (``hostile.py``). May import: ``config``, ``api``,
``inference``, ``weights``, ``tasks``, ``reward``, ``role``, ``metrics``, ``devices``; never ``validator``, ``trainer`` or
``orchestrator``.
"""
