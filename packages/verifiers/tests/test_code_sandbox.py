"""The sandbox: correct, wrong and partial programs, and hostile ones scored 0 with the host intact."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from verifiers.code import bwrap_available, run_tests
from verifiers.code.privileges import fallback_python

NO_FALLBACK = "rlimit fallback refuses to run here (root, no interpreter usable by an unprivileged uid)"
SANDBOXES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_available(), reason="bubblewrap unusable here")),
    pytest.param("rlimit", marks=pytest.mark.skipif(fallback_python().path is None, reason=NO_FALLBACK)),
]
DOUBLE = {"inputs": ["3\n", "5\n", "0\n"], "outputs": ["6\n", "10\n", "0\n"]}


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_correct_wrong_partial_stdio(sandbox):
    ok = run_tests("print(int(input()) * 2)", DOUBLE, sandbox=sandbox)
    assert (ok.passed, ok.total, ok.sandbox) == (3, 3, sandbox) and ok.all_passed
    wrong = run_tests("print(int(input()) + 2)", DOUBLE, sandbox=sandbox)
    assert wrong.passed == 0 and [o.status for o in wrong.outcomes] == ["wrong_answer"] * 3
    partial = run_tests("n = int(input())\nprint(n * 2 if n < 4 else n)", DOUBLE, sandbox=sandbox)
    assert (partial.passed, partial.fraction, partial.all_passed) == (2, 2 / 3, False)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_function_call_tests(sandbox):
    tests = {
        "inputs": ["1\n2", "[1, 2]\n[3]", "5\n5"],
        "outputs": ["3", "[[1, 2, 3]]", "11"],
        "fn_name": "add",
    }
    result = run_tests(
        "class Solution:\n    def add(self, a, b):\n        return a + b", tests, sandbox=sandbox
    )
    assert [o.status for o in result.outcomes] == ["passed", "passed", "wrong_answer"]
    plain = run_tests("def add(a, b):\n    return a + b", tests, sandbox=sandbox)
    assert plain.passed == 2
    missing = run_tests("def other(a, b):\n    return 0", tests, sandbox=sandbox)
    assert missing.passed == 0 and missing.outcomes[0].status == "runtime_error"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_tests_are_isolated_from_each_other(sandbox):
    # Each test runs in a fresh fork in its own empty directory: nothing carries over.
    program = "import os\nprint(os.listdir('.'))\nopen('marker', 'w').write('x')"
    result = run_tests(program, {"inputs": ["", ""], "outputs": ["[]", "[]"]}, sandbox=sandbox)
    assert result.passed == 2
    state = run_tests(
        "x = globals().setdefault('n', 0) + 1\nglobals()['n'] = x\nprint(x)",
        {"inputs": ["", ""], "outputs": ["1", "1"]},
    )
    assert state.passed == 2


def test_language_and_empty_tests():
    with pytest.raises(ValueError, match="only 'python'"):
        run_tests("int main(){}", DOUBLE, language="cpp")
    assert run_tests("print(1)", {"inputs": [], "outputs": []}).total == 0


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_sandbox_runs_counts_each_scored_sample_once(sandbox):
    """One count per run_tests call that ran the program (3 tests -> 1), by kind; calls refused
    before running anything add nothing; concurrent scoring threads lose no count."""
    from verifiers import Task, verify_batch
    from verifiers.code import sandbox_runs

    before = sandbox_runs()
    run_tests("print(int(input()) * 2)", DOUBLE, sandbox=sandbox)  # 3 test cases, one sample
    with pytest.raises(ValueError):
        run_tests("int main(){}", DOUBLE, language="cpp")
    run_tests("print(1)", {"inputs": [], "outputs": []}, sandbox=sandbox)
    assert sandbox_runs().get(sandbox, 0) == before.get(sandbox, 0) + 1
    if sandbox == "bwrap":  # verify's default sandbox: the reward path a validator takes
        task = Task("Double it.", "prime_rl_code", {"test_cases": DOUBLE})
        completions = ["```python\nprint(int(input()) * 2)\n```"] * 4
        verify_batch([task] * 4, completions, max_workers=4)
        assert sandbox_runs()["bwrap"] == before.get("bwrap", 0) + 5


# ------------------------------------------------------------------ hostile programs

ONE = {"inputs": ["1\n"], "outputs": ["1\n"]}
HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('1' * 65536)",
    "exit_before_tests": "import os\nos._exit(0)",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(1)",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_hostile_program_scores_zero(sandbox, name):
    result = run_tests(HOSTILE[name], ONE, timeout_per_test=1.0, memory_mb=256, sandbox=sandbox)
    assert result.passed == 0
    assert result.outcomes[0].status in {
        "timeout",
        "memory",
        "output_limit",
        "wrong_answer",
        "not_run",
        "killed",
    }
    # the host can still fork and run a sandbox afterwards
    assert run_tests("print(1)", ONE, sandbox=sandbox).passed == 1


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap unusable here")
def test_write_outside_scratch_is_impossible(tmp_path):
    target = tmp_path / f"escape-{uuid.uuid4().hex}"
    program = (
        "import os\n"
        f"for path in [{str(target)!r}, '/usr/escape', '/tmp/../escape', os.path.expanduser('~/escape')]:\n"
        "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\n"
        "open('scratch-ok', 'w').write('fine')\nprint(open('scratch-ok').read())"
    )
    result = run_tests(program, {"inputs": [""], "outputs": ["fine"]}, sandbox="bwrap")
    assert result.passed == 1  # the scratch dir is writable
    assert not target.exists() and not Path("/usr/escape").exists() and not Path("/escape").exists()


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap unusable here")
def test_network_is_unreachable(loopback_listener):
    port = loopback_listener.getsockname()[1]
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_tests(program, {"inputs": [""], "outputs": ["connected"]}, sandbox="bwrap")
    assert result.passed == 0 and result.outcomes[0].status == "runtime_error"
    with pytest.raises(TimeoutError):
        loopback_listener.accept()  # nothing reached the host's loopback


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_expected_outputs_cannot_be_read(sandbox):
    secret = uuid.uuid4().hex
    program = (
        "import os, gc\nfound = []\n"
        "for root in ['/tmp', os.getcwd(), '/work', '/root', '/home', '/proc/1', '/proc/self']:\n"
        "    for dirpath, dirs, files in os.walk(root):\n"
        "        dirs[:] = [d for d in dirs if d not in ('task', 'net', 'sys')][:20]\n"
        "        for f in files[:200]:\n"
        "            path = os.path.join(dirpath, f)\n"
        "            if os.path.islink(path) or not os.path.isfile(path):\n"
        "                continue\n"
        "            try:\n"
        "                data = open(path, 'rb').read(1 << 20)\n"
        "            except Exception:\n                continue\n"
        f"            i = data.find(b'{secret[:8]}')\n"
        "            if i >= 0:\n                found.append(data[i:i + 32].decode(errors='ignore'))\n"
        "for obj in gc.get_objects():\n"
        f"    if isinstance(obj, str) and obj.startswith('{secret[:8]}') and len(obj) == 32:\n"
        "        found.append(obj)\n"
        "print(found[0] if found else 'nothing')"
    )
    # the program itself contains only the first 8 characters; the answer is the full secret
    result = run_tests(program, {"inputs": [""], "outputs": [secret]}, timeout_per_test=10.0, sandbox=sandbox)
    assert result.passed == 0 and result.outcomes[0].status in ("wrong_answer", "timeout")


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap unusable here")
def test_background_process_does_not_outlive_the_test(processes_tagged):
    tag = uuid.uuid4().hex
    program = (
        "import subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 30 # {tag}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint('spawned')"
    )
    result = run_tests(program, {"inputs": [""], "outputs": ["not this"]}, sandbox="bwrap")
    assert result.passed == 0 and result.outcomes[0].status == "wrong_answer"
    assert processes_tagged(tag) == []


def test_file_size_limit():
    program = "f = open('big', 'wb')\nwhile True:\n    f.write(bytes(1 << 20))"
    result = run_tests(program, ONE, timeout_per_test=5.0)
    assert result.passed == 0 and "File too large" in result.outcomes[0].stderr_tail


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_spare_runners_outlive_the_thread_that_asked_for_them(sandbox):
    """bwrap --die-with-parent fires when the *thread* that started a runner exits. Spares used to
    be started by a short-lived thread and died with it (a handed-out spare then failed with
    "sandbox failed to start" and scored a correct program 0); now they stay alive and serve."""
    import threading
    import time

    from verifiers.code import sandbox as sandbox_module

    pool = sandbox_module._SparePool()
    try:
        asker = threading.Thread(target=lambda: sandbox_module._discard(pool.take(sandbox)))
        asker.start()
        asker.join()
        deadline = time.monotonic() + 20
        while len(pool._spares.get(sandbox, [])) < sandbox_module.SPARES and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the old refill thread had exited by now, and its runners with it
        spares = list(pool._spares[sandbox])
        assert len(spares) == sandbox_module.SPARES
        assert [proc.poll() for proc in spares] == [None] * len(spares)
    finally:
        pool.close()


def test_a_runner_that_dies_before_it_is_ready_is_replaced(monkeypatch):
    """A runner that exits before its start report ran nothing, so the run starts a fresh one
    instead of scoring the program 0 ("sandbox failed to start")."""
    import subprocess

    from verifiers.code import sandbox as sandbox_module

    kind = sandbox_module.default_sandbox()
    if kind == "rlimit" and fallback_python().path is None:
        pytest.skip(NO_FALLBACK)
    dead = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    monkeypatch.setattr(sandbox_module._SPARES, "take", lambda kind: dead)
    result = run_tests("print(6 * 7)", {"inputs": [""], "outputs": ["42"]})
    assert result.all_passed and result.error is None


def test_a_run_the_machine_spoiled_is_logged(monkeypatch, caplog):
    """A runner that never starts (all retries) or a timed-out test is the machine's outcome, not
    the program's: it is logged, so a reward that a re-scorer disagrees with can be traced."""
    import subprocess

    from verifiers.code import sandbox as sandbox_module

    kind = sandbox_module.default_sandbox()
    if kind == "rlimit" and fallback_python().path is None:
        pytest.skip(NO_FALLBACK)

    def dead_runner(kind: str) -> subprocess.Popen:
        return subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    monkeypatch.setattr(sandbox_module._SPARES, "take", dead_runner)
    monkeypatch.setattr(sandbox_module, "_start_runner", dead_runner)
    with caplog.at_level("WARNING", logger="verifiers.code"):
        result = run_tests("print(6 * 7)", {"inputs": [""], "outputs": ["42"]})
    assert not result.all_passed and "failed to start" in (result.error or "")
    assert any("failed to start" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    caplog.clear()
    with caplog.at_level("WARNING", logger="verifiers.code"):
        result = run_tests("while True: pass", {"inputs": [""], "outputs": ["42"]}, timeout_per_test=0.5)
    assert [o.status for o in result.outcomes] == ["timeout"]
    assert any("timed out" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="verifiers.code"):
        assert run_tests("print(41)", {"inputs": [""], "outputs": ["42"]}).passed == 0  # a wrong answer is not
    assert not caplog.records
