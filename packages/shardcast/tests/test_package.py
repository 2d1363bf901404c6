"""Package surface: lazy exports are complete and publishing does not load aiohttp or torch."""

from __future__ import annotations

import subprocess
import sys

import shardcast


def test_all_matches_lazy_exports() -> None:
    assert set(shardcast.__all__) == {*shardcast._EXPORTS, "__version__"}
    for name in shardcast.__all__:
        assert getattr(shardcast, name) is not None


def test_publish_path_imports_neither_aiohttp_nor_torch() -> None:
    code = (
        "import sys, shardcast; from shardcast import publish_file, parse_manifest, Manifest; "
        "import shardcast.cli; "
        "bad = [m for m in ('aiohttp', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
