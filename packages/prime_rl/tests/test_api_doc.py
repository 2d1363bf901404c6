"""API.md matches the code: every endpoint exists and validates the body model the page names."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import requests

from prime_rl.api import protocol
from prime_rl.orchestrator.server import ROUTES

API_MD = (Path(__file__).parent.parent / "API.md").read_text()


def _endpoint_sections() -> dict[tuple[str, str], str]:
    sections = re.split(r"^### ", API_MD, flags=re.M)[1:]
    result = {}
    for section in sections:
        match = re.match(r"`(GET|POST|PUT|DELETE) (/[^`]*)`", section)
        if match:
            result[(match.group(1), match.group(2))] = section
    return result


def _model_tables() -> dict[str, list[str]]:
    tables = {}
    for section in re.split(r"^#### ", API_MD, flags=re.M)[1:]:
        name = re.match(r"`(\w+)`", section)
        assert name, section[:40]
        tables[name.group(1)] = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    return tables


def test_documented_endpoints_are_exactly_the_served_ones() -> None:
    assert set(_endpoint_sections()) == set(ROUTES)


def test_documented_body_models_are_the_validated_ones() -> None:
    for route, section in _endpoint_sections().items():
        named = re.search(r"Body: `(\w+)`", section)
        expected = ROUTES[route].body
        if expected is None:
            assert named is None, route
        else:
            assert named is not None and named.group(1) == expected.__name__, route


def test_every_model_table_lists_exactly_the_model_fields() -> None:
    tables = _model_tables()
    wire_models = {
        name
        for name in protocol.__all__
        if isinstance(getattr(protocol, name), type)
        and issubclass(getattr(protocol, name), protocol.ApiModel)
        and name != "ApiModel"
    }
    assert set(tables) == wire_models
    for name, fields in tables.items():
        model = getattr(protocol, name)
        assert fields == list(model.model_fields), name


def _raised_error_codes() -> set[tuple[str, str]]:
    """(status, code) of every ``ApiFailure(status, code, ...)`` / ``error_response(status, code, ...)`` call in
    the orchestrator room, read from the syntax tree (a code in a comment or docstring does not count)."""
    found = set()
    room = Path(__file__).parent.parent / "src" / "prime_rl" / "orchestrator"
    for path in room.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in ("ApiFailure", "error_response") or len(node.args) < 2:
                continue
            status, code = node.args[0], node.args[1]
            if isinstance(status, ast.Constant) and isinstance(code, ast.Constant):
                found.add((str(status.value), str(code.value)))
    return found


def test_documented_error_codes_are_exactly_the_raised_ones() -> None:
    documented = set(re.findall(r"^\| (\d{3}) \| `(\w+)` \|", API_MD, flags=re.M))
    raised = _raised_error_codes()
    assert ("404", "not_found") in raised and len(raised) >= 8  # the reader itself works
    assert documented == raised


def test_every_endpoint_is_served_and_validates_its_body(server: Any) -> None:
    """Each documented route answers (not 404/405); each POST route rejects a body off its schema."""
    admin = {"Authorization": f"Bearer {server.admin_token}"}  # trusted routes check it before the body
    for (method, path), route in ROUTES.items():
        model = route.body
        if method == "GET":
            answer = requests.get(server.url + path, params={"worker_id": "w9999"}, headers=admin, timeout=10)
            assert answer.status_code not in (405, 500), (path, answer.text)
            if path == "/tasks":
                assert answer.json()["error"] == "not_found"  # documented 404 for an unknown worker
            elif path == "/rollouts/verdicts":
                assert answer.json()["error"] == "bad_request"  # batch_id is required
                params = {"worker_id": "w9999", "batch_id": "w9999-s0-b0"}
                answer = requests.get(server.url + path, params=params, timeout=10)
                assert answer.json()["error"] == "not_found"
            else:
                assert answer.status_code == 200, (path, answer.text)
            continue
        assert model is not None
        for bad in (b"{", b"[]", b'{"unknown_key": 1}', b'{"step": "1"}'):
            answer = requests.post(server.url + path, data=bad, headers=admin, timeout=10)
            assert answer.status_code == 400, (path, bad, answer.text)
            assert answer.json()["error"] == "bad_request"
        wrong = requests.get(server.url + path, timeout=10)
        assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"
    assert requests.get(server.url + "/no/such/path", timeout=10).json()["error"] == "not_found"


def test_every_verdict_reason_is_documented() -> None:
    from prime_rl.validator.checks import Reason

    section = API_MD[API_MD.index("### What the validator checks") : API_MD.index("## Endpoints")]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    assert {reason.value for reason in Reason} - {"ok"} <= documented
