"""Adapters that run a :class:`grpo.Loss` inside other trainers: optional extras, never imported by ``grpo``.

* :mod:`grpo.integrations.trl`: ``GrpoTrainer``, a TRL ``GRPOTrainer`` whose loss is any
  :class:`grpo.Loss` (``pip install "intellect2-grpo[trl]"``).
* :mod:`grpo.integrations.verl`: policy-loss functions registered in verl's policy-loss
  registry (``pip install "intellect2-grpo[verl]"``).

Each module imports its peer at import time and fails with an ``ImportError`` naming the extra
to install when the peer is missing.
"""
