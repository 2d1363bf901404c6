"""The trusted GRPO trainer (``prime-rl trainer``, or under ``torchrun`` for FSDP2).

Owns: packing claimed samples into micro-batches (``batching.py``), the policy forward pass
(``forward.py``), one optimizer step with the ``grpo`` loss (``step.py``), full training-state
checkpoints (``checkpoint.py``), data parallelism (``distributed.py``) and the process that claims,
trains and publishes (``process.py``). May import: ``config``, ``api``, ``weights``, ``role``, ``metrics``,
``devices``, ``durable``, torch, grpo, shardcast; never ``worker``, ``validator``, ``inference`` or ``orchestrator``.
"""
