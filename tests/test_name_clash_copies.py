"""The five packages' ``_name_clash.py`` are one module, copied.

Each package installs and works alone (``pip install intellect2-toploc`` pulls in none of the
others), so none can import the warning from another or from a shared package; each ships its own
copy. This test keeps the copies identical: a fix made to one must be made to all (copy
``packages/prime_rl/src/prime_rl/_name_clash.py`` over the others). The behaviour is tested once,
by ``tests/support/name_clash_check.py``, from each package's ``tests/test_name_clash.py``.
"""

from __future__ import annotations

from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
NAMES = ("toploc", "shardcast", "grpo", "verifiers", "prime_rl")


def test_every_package_carries_the_same_name_clash_module():
    reference = (PACKAGES / "prime_rl" / "src" / "prime_rl" / "_name_clash.py").read_bytes()
    copies = {name: PACKAGES / name / "src" / name / "_name_clash.py" for name in NAMES}
    assert all(path.is_file() for path in copies.values()), copies
    assert [name for name, path in copies.items() if path.read_bytes() != reference] == []


def test_every_package_tests_its_name_clash_warning_with_the_shared_check():
    for name in NAMES:
        test = PACKAGES / name / "tests" / "test_name_clash.py"
        assert "import_warns_in_one_line_naming_both(" in test.read_text(), test
