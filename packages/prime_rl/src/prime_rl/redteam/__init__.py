"""The red team: hostile worker behaviours, for tests, demos and red-team runs (``prime-rl redteam``).

Owns: the attack table and the hostile worker (``attacks.py``), and the attacks by family: the
single-turn forgeries of an honest batch (``forgeries.py``), the in-flight span forgeries' decoding
helpers (``spans.py``), the multi-turn episode forgeries (``episodes.py``); and the process that
plays one behaviour (``process.py``: the honest worker's loop with hostile answers).
May import: ``config``, ``api``, ``inference``, ``weights``, ``tasks``, ``reward``, ``episodes``,
``role``, ``metrics``, ``devices``, ``durable``, ``worker`` (the loop it plays inside). No honest
role imports it (``tests/test_layout.py``): attack code never ships on the honest path.
"""
