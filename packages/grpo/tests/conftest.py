"""grpo tests: make the shared oracle helpers (grpo_oracles_lib.py) importable under importlib mode.

Appended, not inserted first: shardcast's tests import their own ``conftest`` by name from the
front of sys.path, and this folder must not shadow it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parent))
