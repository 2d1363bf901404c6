"""Make this folder's helper modules (``torch26_randn``) importable under importlib mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
