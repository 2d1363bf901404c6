"""Docs a user can trust: each README names the version it documents, the CHANGELOG's newest
entry is that version, and the doc build (`make docs`) fails on a reference that does not resolve.

The full site is built by `make docs` (part of `make test`); the last test here builds two tiny
pages with the same configuration to show that the check can fail, and on what.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "toploc": "intellect2-toploc",
    "shardcast": "intellect2-shardcast",
    "grpo": "intellect2-grpo",
    "verifiers": "intellect2-verifiers",
    "prime_rl": "intellect2-prime-rl",
}


def version_of(package: str) -> str:
    """``__version__`` as written in the source (no import: torch-free and exact)."""
    text = (ROOT / "packages" / package / "src" / package / "__init__.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    assert found, f"no __version__ line in {package}/__init__.py"
    return found.group(1)


@pytest.mark.parametrize("package", DISTRIBUTIONS)
def test_readme_names_the_version_it_documents(package: str) -> None:
    readme = (ROOT / "packages" / package / "README.md").read_text()
    named = re.findall(r"This README documents \*\*(\S+) (\S+)\*\*", readme)
    assert named == [(DISTRIBUTIONS[package], version_of(package))], (
        f"packages/{package}/README.md must say 'This README documents **{DISTRIBUTIONS[package]} "
        f"{version_of(package)}**' once (bump both together; docs/versioning.md)"
    )


@pytest.mark.parametrize("package", DISTRIBUTIONS)
def test_changelog_starts_with_the_current_version(package: str) -> None:
    changelog = (ROOT / "packages" / package / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+) \(", changelog, re.M)
    assert versions, f"packages/{package}/CHANGELOG.md has no '## X.Y.Z (date)' heading"
    assert versions[0] == version_of(package), (
        f"the newest CHANGELOG entry of {package} is {versions[0]}, but __version__ is {version_of(package)}"
    )
    numbers = [tuple(int(n) for n in v.split(".")) for v in versions]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)


def test_docs_pages_are_reachable() -> None:
    index = (ROOT / "docs" / "index.rst").read_text()
    assert "versioning" in index and "changelog" in index
    changelog_page = (ROOT / "docs" / "changelog.md").read_text()
    for package in DISTRIBUTIONS:
        assert f"../packages/{package}/CHANGELOG.md" in changelog_page
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\bdocs\b", makefile, re.M), "make test must build the docs"


PAGE = """Probe
=====

.. automodule:: toploc.errors

.. automodule:: toploc.proofs
   :no-members:

.. automodule:: toploc.streaming
   :no-members:

.. autoclass:: toploc.streaming.ProofBuilder
   :no-members:

.. autofunction:: toploc.proofs.build_proofs_bytes

A re-export links to where it is defined: :func:`toploc.build_proofs_bytes`,
:class:`toploc.ProofBuilder`. Another library's name is plain text: :class:`torch.Tensor`.
"""


def build(page: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "src"
    source.mkdir(parents=True, exist_ok=True)
    (source / "index.rst").write_text(page)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-n",
            "-W",
            "-q",
            "-c",
            str(ROOT / "docs"),
            str(source),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None, reason="sphinx is in the dev group")
def test_the_doc_build_fails_on_a_reference_that_does_not_resolve(tmp_path: Path) -> None:
    good = build(PAGE, tmp_path / "good")
    assert good.returncode == 0, good.stderr[-3000:]
    html = (tmp_path / "good" / "out" / "index.html").read_text()
    assert (
        'href="#toploc.proofs.build_proofs_bytes"' in html and 'href="#toploc.streaming.ProofBuilder"' in html
    )
    misspelled = build(PAGE + "\nA typo: :func:`toploc.build_proof_bytes`.\n", tmp_path / "bad")
    assert misspelled.returncode != 0
    assert "py:func reference target not found: toploc.build_proof_bytes" in misspelled.stderr
