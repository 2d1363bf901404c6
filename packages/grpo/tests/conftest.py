"""grpo tests: make the shared oracle helpers (grpo_oracles_lib.py) importable under importlib mode."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
