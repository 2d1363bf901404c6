"""The held-out evaluator (``prime-rl evaluator``): greedy accuracy of each policy version.

Owns: the held-out problem set, the versions to evaluate and the greedy evaluation itself
(``heldout.py``: pure over a backend; the ``eval`` record's contract) and the process that follows
the published versions through shardcast and logs one record per version (``process.py``).
May import: ``config``, ``inference``, ``weights``, ``tasks``, ``metrics``, ``devices``; never
``worker``, ``validator``, ``trainer`` or ``orchestrator``.
"""
