"""Policy weights on disk and on the wire.

Owns: the one safetensors file a policy version is (``files.py``), the
``<root>/v<N>/model.safetensors`` layout (``layout.py``, torch-free), a local cache of versions
fetched through shardcast and version following built on ``shardcast.Follower`` (``store.py``),
and the run's shardcast origin and relay processes (``broadcast.py``). May import: ``config``,
``metrics``, ``durable``, shardcast, safetensors, torch (``files.py``, and ``store.py`` for its
state-dict type); never a role room.
"""
