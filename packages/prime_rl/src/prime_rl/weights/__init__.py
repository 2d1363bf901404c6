"""Policy weights on disk and on the wire.

Owns: the one safetensors file a policy version is (``files.py``), the ``<root>/v<N>/`` folder
layout (``layout.py``), a local cache of versions fetched through shardcast and version following
(``store.py``), and the run's shardcast origin and relay processes (``broadcast.py``). May import:
``config``, ``metrics``, shardcast, safetensors, torch (``files.py`` only); never a role room.
"""
