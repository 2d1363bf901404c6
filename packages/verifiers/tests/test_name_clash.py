"""Name clash detection: another distribution that provides `verifiers` is named on import."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from name_clash_check import fake_distribution, import_warns_in_one_line_naming_both  # tests/support

from verifiers._name_clash import NameClashWarning, clashing_distributions, warn_on_name_clash


@pytest.mark.parametrize("declare", ["top_level", "record"])
def test_agrees_with_packages_distributions(tmp_path, monkeypatch, declare):
    fake_distribution(tmp_path, "verifiers", "0.1.9", "verifiers", declare=declare)
    fake_distribution(tmp_path, "unrelated-thing", "1.0", "unrelated", declare=declare)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    reference = importlib.metadata.packages_distributions()  # the slow full scan, as the oracle
    assert reference["verifiers"] == ["verifiers"]
    assert clashing_distributions("verifiers", "intellect2-verifiers") == ["verifiers"]
    assert clashing_distributions("unrelated", "intellect2-verifiers") == reference["unrelated"]
    assert clashing_distributions("verifiers", "verifiers") == []  # its own name is no clash
    assert clashing_distributions("absent", "intellect2-verifiers") == []


def test_own_distribution_alone_is_silent(tmp_path, monkeypatch, recwarn):
    fake_distribution(tmp_path, "intellect2-verifiers", "0.1.0", "verifiers", declare="record")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert warn_on_name_clash("verifiers", "intellect2_verifiers", others_hint="x") == []
    assert not [w for w in recwarn if issubclass(w.category, NameClashWarning)]


def test_broken_metadata_never_breaks_import(tmp_path, monkeypatch):
    (tmp_path / "verifiers").mkdir()
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"\xff\xfe not metadata")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert warn_on_name_clash("verifiers", "intellect2-verifiers", others_hint="x") == []


def test_import_warns_in_one_line_naming_both(tmp_path):
    ours = Path(__file__).resolve().parents[1] / "src"
    import_warns_in_one_line_naming_both(tmp_path, "verifiers", ours, other="verifiers", version="0.1.9")
