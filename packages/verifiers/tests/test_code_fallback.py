"""The rlimit fallback as root: hostile probes are contained without bubblewrap.

Every probe runs with `sandbox="rlimit"` and reports what it managed to do; the host then
checks its own state too. These tests need root (only then does the fallback drop to a
fresh uid and build namespaces); `test_refuses_*` runs everywhere.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from verifiers.code import bwrap_available, run_tests
from verifiers.code import sandbox as sandbox_module
from verifiers.code.privileges import UID_RANGE, FallbackPython, _starts_unprivileged, fallback_python

ROOT = os.getuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="the fallback drops privileges only when the host runs as root")
needs_fallback = pytest.mark.skipif(
    fallback_python().path is None,
    reason="rlimit fallback refuses to run here (root, no unprivileged interpreter)",
)


def _kernel_allows_unshare(flags: int) -> bool:
    pid = os.fork()
    if pid == 0:  # try in a throwaway child: unshare would move this process otherwise
        os._exit(0 if ctypes.CDLL(None).unshare(flags) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _linux_at_least(major: int, minor: int) -> bool:
    numbers = os.uname().release.split("-")[0].split(".")
    return (int(numbers[0]), int(numbers[1])) >= (major, minor)


# Containers with a strict seccomp profile refuse these to root; the fallback then logs that it
# is weak (tested below) and the probes that need the namespace are skipped, not failed.
NO_NETNS = ROOT and not _kernel_allows_unshare(0x40000000)  # CLONE_NEWNET
NO_MOUNTNS = ROOT and not _kernel_allows_unshare(0x00020000)  # CLONE_NEWNS
needs_mountns = pytest.mark.skipif(NO_MOUNTNS, reason="this kernel refuses unshare(CLONE_NEWNS) to root")


def _run(program: str, expected: str, **kwargs):
    return run_tests(program, {"inputs": [""], "outputs": [expected]}, sandbox="rlimit", **kwargs)


def _assert_passed(result) -> None:
    outcome = result.outcomes[0]
    assert result.passed == 1, (outcome.status, outcome.stderr_tail, result.error)


@pytest.fixture
def public_dir():
    """A fresh directory in /tmp that others may search (0755); pytest's tmp_path is 0700."""
    path = Path(tempfile.mkdtemp(prefix="verifiers-probe-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def open_dir(public_dir):
    """A world-writable (0777, no sticky bit) directory holding a file root owns."""
    public_dir.chmod(0o777)
    (public_dir / "victim").write_text("intact")
    return public_dir


@as_root
@needs_fallback
def test_runs_as_a_fresh_uid_that_cannot_regain_root():
    program = (
        "import os\n"
        "uid = os.getuid()\n"
        f"print({UID_RANGE[0]} <= uid < {UID_RANGE[1]}, os.getresuid() == (uid,) * 3, os.getresgid() == (uid,) * 3)\n"
        "print(os.getgroups(), [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')])\n"
        "try:\n    os.setuid(0)\n    print('became root')\nexcept PermissionError:\n    print('stays unprivileged')\n"
        "open('scratch-file', 'w').write('fine')\nprint(open('scratch-file').read())"
    )
    _assert_passed(_run(program, "True True True\n[] ['1']\nstays unprivileged\nfine"))


@as_root
@needs_fallback
def test_clean_environment_and_no_inherited_fds():
    leaked = os.open(os.devnull, os.O_RDONLY)  # not inheritable, but make sure nothing leaks
    os.set_inheritable(leaked, True)
    try:
        program = (
            "import os\nprint(sorted(os.environ))\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
        )
        # 0-2 stdio, 3 the call-mode result pipe, 4 the directory being listed
        _assert_passed(_run(program, "['LANG', 'PATH']\n[0, 1, 2, 3, 4]"))
    finally:
        os.close(leaked)


@as_root
@needs_fallback
@needs_mountns
def test_writes_outside_scratch_are_contained(tmp_path, open_dir):
    tag = uuid.uuid4().hex
    targets = [
        str(tmp_path / f"escape-{tag}"),  # root-owned 0700 directory
        str(open_dir / f"escape-{tag}"),  # world-writable directory
        f"/tmp/escape-{tag}",  # world-writable, sticky
        f"/var/tmp/escape-{tag}",
        f"/dev/shm/escape-{tag}",
        f"/usr/escape-{tag}",
        f"/escape-{tag}",
    ]
    program = (
        "import os\nescaped = []\n"
        f"for path in {targets!r}:\n"
        "    try:\n        open(path, 'w').write('x')\n        escaped.append(path)\n    except OSError:\n        pass\n"
        "for action in (lambda: os.remove(VICTIM), lambda: os.rename(VICTIM, VICTIM + '2'),\n"
        "               lambda: open(VICTIM, 'w').write('overwritten')):\n"
        "    try:\n        action()\n        escaped.append('victim')\n    except OSError:\n        pass\n"
        "open('in-scratch', 'w').write('ok')\nprint(escaped, open('in-scratch').read())"
    ).replace("VICTIM", repr(str(open_dir / "victim")))
    _assert_passed(_run(program, "[] ok"))
    assert [t for t in targets if Path(t).exists()] == []
    assert sorted(p.name for p in open_dir.iterdir()) == ["victim"]
    assert (open_dir / "victim").read_text() == "intact"


@as_root
@needs_fallback
def test_root_only_file_cannot_be_read(public_dir):
    (public_dir / "secret").write_text(uuid.uuid4().hex)
    (public_dir / "secret").chmod(0o600)
    (public_dir / "public").write_text("public")
    (public_dir / "public").chmod(0o644)
    program = (
        "def read(path):\n    try:\n        return open(path).read()\n"
        "    except PermissionError:\n        return 'denied'\n"
        f"print(read({str(public_dir / 'public')!r}), read({str(public_dir / 'secret')!r}))"
    )
    # the world-readable neighbour proves the path is reachable: only the mode stops it
    _assert_passed(_run(program, "public denied"))


@as_root
@needs_fallback
def test_fork_bomb_hits_rlimit_nproc():
    program = (
        "import os, time\nforks = 0\n"
        "try:\n    while forks < 1000:\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        forks += 1\n"
        "except OSError as exc:\n    print('limited', forks < 64, exc.errno)"
    )
    # RLIMIT_NPROC=64 counts every process of the fresh uid (runner, test, its forks): EAGAIN
    # well before 64 forks. As uid 0 the limit would be ignored and all 1000 forks succeed.
    _assert_passed(_run(program, "limited True 11", timeout_per_test=10.0))
    assert run_tests("print(1)", {"inputs": [""], "outputs": ["1"]}, sandbox="rlimit").passed == 1


@as_root
@needs_fallback
@pytest.mark.skipif(NO_NETNS, reason="this kernel refuses unshare(CLONE_NEWNET) to root")
def test_loopback_listener_is_unreachable(loopback_listener):
    port = loopback_listener.getsockname()[1]
    program = (
        "import socket\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
        "except OSError as exc:\n    print('blocked', type(exc).__name__)"
    )
    result = _run(program, "blocked OSError")  # ENETUNREACH: the namespace's lo is down
    _assert_passed(result)
    with pytest.raises(TimeoutError):
        loopback_listener.accept()  # nothing reached the host's loopback


@as_root
@needs_fallback
@pytest.mark.parametrize("mode", [0o700, 0o755])
def test_interpreter_probe_sees_what_the_dropped_uid_sees(public_dir, mode):
    # a venv under a root-only directory (pyenv in /root) is exactly the 0o700 case
    folder = public_dir / "prefix"
    folder.mkdir()
    os.symlink(str(fallback_python().path), folder / "python3")
    folder.chmod(mode)
    assert _starts_unprivileged(str(folder / "python3")) is (mode == 0o755)


def test_refuses_to_run_as_root_without_an_unprivileged_interpreter(monkeypatch):
    reason = "rlimit fallback refuses to run untrusted code as root: test"
    monkeypatch.setattr(sandbox_module, "fallback_python", lambda: FallbackPython(None, True, reason))
    result = run_tests("print(1)", {"inputs": ["", ""], "outputs": ["1", "1"]}, sandbox="rlimit")
    assert (result.passed, result.sandbox, result.error) == (0, "rlimit", reason)
    assert [o.status for o in result.outcomes] == ["not_run", "not_run"]


@as_root
@needs_fallback
def test_background_process_dies_with_its_test(processes_tagged):
    tag = uuid.uuid4().hex
    program = (
        "import subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 30 # {tag}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint('spawned')"
    )
    # it leaves the test's session; the runner kills every process of the run's fresh uid
    _assert_passed(_run(program, "spawned"))
    assert processes_tagged(tag) == []


@as_root
@needs_fallback
@pytest.mark.parametrize("sandbox", ["rlimit", "bwrap"])
def test_a_drop_that_leaves_root_is_refused(monkeypatch, sandbox):
    if sandbox == "bwrap" and not bwrap_available():
        pytest.skip("bubblewrap unusable here")
    # "dropping" to uid 0 succeeds as a call but must fail the runner's verification
    monkeypatch.setattr(sandbox_module, "fresh_uid", lambda: 0)
    result = run_tests("print(1)", {"inputs": [""], "outputs": ["1"]}, sandbox=sandbox)
    assert (result.passed, result.outcomes[0].status) == (0, "not_run")
    assert result.error is not None and "setuid(0) succeeded after dropping privileges" in result.error


@as_root
@needs_fallback
@pytest.mark.skipif(NO_NETNS, reason="this kernel refuses unshare(CLONE_NEWNET) to root")
@needs_mountns
def test_runner_reports_full_isolation(caplog):
    raw = sandbox_module.run_in_sandbox("print(1)", "stdio", [""], sandbox="rlimit")
    assert raw.runner_error is None and len(raw.tests) == 1
    uid = raw.isolation.pop("uid")
    assert UID_RANGE[0] <= uid < UID_RANGE[1]
    expected = {"net_isolated": True, "fs_readonly": True, "proc_private": True, "no_new_privs": True}
    assert raw.isolation == expected
    assert "rlimit sandbox as root runs without" not in caplog.text


@as_root
def test_weak_root_fallback_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(sandbox_module, "_WARNED", set())
    weak = {
        "uid": 200_001,
        "net_isolated": True,
        "fs_readonly": False,
        "proc_private": True,
        "no_new_privs": True,
    }
    for _ in range(2):
        sandbox_module._warn_if_weak("rlimit", weak)
    sandbox_module._warn_if_weak("bwrap", {"uid": 200_001})
    assert [r.getMessage() for r in caplog.records] == [
        "rlimit sandbox as root runs without fs_readonly (kernel refused); use bubblewrap"
    ]


@as_root
@needs_fallback
@needs_mountns
@pytest.mark.skipif(not _linux_at_least(5, 8), reason="Linux < 5.8: proc mounts share the host's options")
def test_host_processes_are_invisible():
    program = (
        "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        f"print(pids == [str(os.getpid())], {str(os.getpid())!r} in pids)"
    )
    # hidepid=invisible: only processes it may ptrace, i.e. itself (the runner is not dumpable)
    _assert_passed(_run(program, "True False"))


@as_root
@needs_fallback
def test_killing_the_runner_does_not_leave_processes_behind(processes_tagged):
    tag = uuid.uuid4().hex
    program = (
        "import os, signal, subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 30 # {tag}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "os.kill(os.getppid(), signal.SIGKILL)"
    )
    # the runner dies before it can clean up; the host then kills every process of the uid
    result = _run(program, "")
    assert (result.passed, result.outcomes[0].status) == (0, "not_run")
    assert result.error == "runner exited early (killed by the program?)"
    assert processes_tagged(tag) == []


@pytest.mark.parametrize("uid", [0, -1, UID_RANGE[0] - 1, UID_RANGE[1]])
def test_kill_uid_never_runs_outside_the_sandbox_range(monkeypatch, uid):
    # kill(-1) as root would signal every process on the machine
    def forbidden(*args, **kwargs):
        raise AssertionError(f"helper started for uid {uid}")

    monkeypatch.setattr(sandbox_module.subprocess, "run", forbidden)
    sandbox_module._kill_uid(uid)
