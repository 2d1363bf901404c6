"""Pluggable admission (orchestrator/admission.py) over real HTTP: allow-list, hook, and the rule
that a non-loopback orchestrator does not let anyone register unless told to."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.config import load_config
from prime_rl.orchestrator.admission import AdmissionError, AdmissionRefused, check_admission
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet

ADMIN = "admin-token-of-24-chars!"


@pytest.fixture
def hook_module() -> Any:
    """A module ``admission_hook_for_tests`` whose ``decide`` admits names starting with "staked"."""
    module = types.ModuleType("admission_hook_for_tests")
    seen: list[dict[str, Any]] = []

    def decide(*, name: str, address: str, headers: Any) -> bool:
        seen.append({"name": name, "address": address, "pow": headers.get("X-Proof-Of-Work")})
        if name == "broken":
            raise RuntimeError("hook bug")
        if name == "explained":
            raise AdmissionRefused("stake below 100")
        return name.startswith("staked")

    module.decide = decide  # type: ignore[attr-defined]
    module.seen = seen  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def _start(tmp_path: Path, *overrides: str) -> OrchestratorServer:
    config = load_config(None, ["--run_dir", str(tmp_path), "--orchestrator.port", "0", *overrides])
    return OrchestratorServer(config, TaskSet([{"prompt": "q"}] * 8)).start()


def test_non_loopback_bind_is_not_open_to_anyone_by_default(tmp_path: Path) -> None:
    base = ["--run_dir", str(tmp_path), "--orchestrator.host", "0.0.0.0", "--orchestrator.admin_token", ADMIN]
    with pytest.raises(AdmissionError, match="registration_token, registration_allowlist or registration_hook"):
        OrchestratorServer(load_config(None, base), TaskSet([{"prompt": "q"}]))
    for extra in (
        ["--orchestrator.registration_token", "per-participant"],
        ["--orchestrator.registration_allowlist", '["10.0.0.0/8"]'],
        ["--orchestrator.open_registration", "true"],
    ):
        check_admission(load_config(None, [*base, *extra]).orchestrator)
    check_admission(load_config(None, ["--run_dir", str(tmp_path)]).orchestrator)  # loopback: open
    with pytest.raises(AdmissionError, match=r"10\.0\.0\.0/33"):
        check_admission(load_config(None, [*base, "--orchestrator.registration_allowlist", '["10.0.0.0/33"]']).orchestrator)
    with pytest.raises(AdmissionError, match="cannot be loaded"):
        check_admission(load_config(None, [*base, "--orchestrator.registration_hook", "no_such_module:f"]).orchestrator)


def test_allowlist_admits_listed_addresses_only(tmp_path: Path) -> None:
    listed = _start(tmp_path / "a", "--orchestrator.registration_allowlist", '["127.0.0.0/8"]')
    unlisted = _start(tmp_path / "b", "--orchestrator.registration_allowlist", '["10.0.0.0/8", "::1/128"]')
    try:
        with OrchestratorClient(listed.url, retries=0) as client:
            assert client.register("near").worker_id == "w0000"
        with OrchestratorClient(unlisted.url, retries=0) as client:
            with pytest.raises(ClientRequestError) as refused:
                client.register("far")
            assert refused.value.status == 403 and "registration_allowlist" in refused.value.message
    finally:
        listed.stop()
        unlisted.stop()


def test_hook_decides_and_fails_closed(tmp_path: Path, hook_module: Any) -> None:
    server = _start(tmp_path, "--orchestrator.registration_hook", "admission_hook_for_tests:decide")
    try:
        with OrchestratorClient(server.url, retries=0) as client:
            assert client.register("staked-1").worker_id == "w0000"
            for name, message in (("anonymous", "admission hook"), ("broken", "admission hook"),
                                  ("explained", "stake below 100")):  # fmt: skip
                with pytest.raises(ClientRequestError) as refused:
                    client.register(name)
                assert refused.value.status == 403 and message in refused.value.message, name
        assert [s["name"] for s in hook_module.seen] == ["staked-1", "anonymous", "broken", "explained"]
        assert hook_module.seen[0]["address"] == "127.0.0.1"
        assert len(server.ledger.workers) == 1  # refused registrations made no identity
    finally:
        server.stop()
