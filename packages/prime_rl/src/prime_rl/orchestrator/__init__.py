"""The orchestrator: the run's trusted bookkeeper behind the HTTP API (``prime-rl orchestrator``).

Owns: the aiohttp server (``server.py``), its one route table and handlers (``routes.py``) with its
HTTP plumbing (``http.py``), the ledger that applies the API's rules (``ledger.py``; by caller:
``ledger_workers.py``, ``ledger_validators.py``, ``ledger_trainer.py``, over ``ledger_state.py``)
over registered workers (``workers.py``), task leases (``leases.py``, over ``lease_history.py``),
stored batches and verdicts (``batches.py``; its validator side ``batch_verdicts.py``, its trainer
side ``batch_claims.py``), the trainer's claims (``claims.py``), the durable SQLite + Arrow-file store (``store.py``, ``payloads.py``, ``records.py``) and per-address rate limits. May import:
``config``, ``api``, ``tasks``, ``metrics``, ``durable``, ``statedb``; never torch (it runs on any small machine) and never
another role room.
"""
