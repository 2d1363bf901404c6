"""Launch the test runner in a sandbox: bubblewrap when available, else an rlimit fallback.

bubblewrap mode ("bwrap"): new PID, network, IPC and UTS namespaces; the host filesystem
is NOT visible except the system directories needed to run Python (`/usr`, `/lib*`, `/bin`,
`/etc/ld.so.cache`, the interpreter's prefix), all read-only; `/tmp` is a private, empty
tmpfs holding one fresh working directory per test (removed after it); the sandbox dies with its parent. When the host runs as
root the runner drops to a per-run unprivileged uid (so RLIMIT_NPROC is enforced and
concurrent sandboxes cannot signal each other). After every test the runner kills every
process in the namespace except itself, so nothing outlives a test.

Fallback mode ("rlimit"): the same runner without bubblewrap: rlimits per test, a new
session per test killed as a group, a private scratch directory, a clean environment and
no inherited fds, PR_SET_NO_NEW_PRIVS. As root it also drops to `fresh_uid()` (verified;
it refuses to run, scoring 0, when no interpreter is usable by that uid, see
`privileges.fallback_python`) inside new network, mount, IPC and UTS namespaces where every
mount is read-only except the scratch directory and /proc shows only the run's own
processes (Linux >= 5.8); after every test it kills every process of that uid. Weaker
than bubblewrap: the host filesystem stays visible (readable where permissions allow), and as non-root nothing is dropped: the test runs as
the caller's uid (network namespace only where unprivileged user namespaces are allowed),
so files the caller may write are writable and background processes can outlive a test.

Both modes run each test in a fresh fork of one runner per program (low overhead) and
never execute untrusted code in the caller's process. To keep interpreter and namespace
startup off the critical path, `SPARES` runners per mode are started ahead of time; each
runs exactly one program and is then discarded (no state is shared between programs).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import logging
import marshal
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from verifiers.code.privileges import UID_RANGE, fallback_python, fresh_uid
from verifiers.errors import SandboxError


def _runner_source() -> str:
    """`_runner.py` with `_runner_isolation.py` inlined at its one import of it (the runner
    runs as `python -I -S -c SOURCE` and can import nothing of ours)."""
    here = Path(__file__).parent
    runner = (here / "_runner.py").read_text().splitlines(keepends=True)
    [at] = [i for i, line in enumerate(runner) if line.startswith("from verifiers.code._runner_isolation import ")]
    return "".join([*runner[:at], (here / "_runner_isolation.py").read_text(), *runner[at + 1 :]])


RUNNER_SOURCE = _runner_source()
SANDBOX_KINDS = ("bwrap", "rlimit")
SPARES = 2  # pre-started runners per mode (each serves one program, then exits)
START_RETRIES = 2  # fresh runners tried after one that died before reporting ready


@dataclass(frozen=True)
class Limits:
    """Per-test resource limits (defaults in parentheses).

    Attributes:
        timeout_s: wall-clock limit per test (5 s, INTELLECT-2's per-test value); CPU limit
            is ceil(timeout_s) + 1 s.
        memory_mb: address-space limit (512 MiB); 0 disables it.
        max_output: bytes of stdout kept per test before it is killed (1 MiB).
        nproc: processes/threads of the sandbox uid (64).
        fsize_mb: largest file a test may write (16 MiB).
        nofile: open file descriptors (64).
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output: int = 1 << 20
    nproc: int = 64
    fsize_mb: int = 16
    nofile: int = 64


@cache
def _python_in_sandbox() -> tuple[str, list[str]]:
    """(path of the interpreter inside the sandbox, extra bwrap bind args)."""
    real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if real.startswith("/usr/"):
        return real, []
    if real.startswith(prefix + "/"):
        return "/python" + real[len(prefix) :], ["--ro-bind", prefix, "/python"]
    return real, ["--ro-bind", os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.dirname(real))]


def _system_binds() -> list[str]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", path, path]
    return args


@cache
def bwrap_available() -> bool:
    """True iff `bwrap` exists and can start a sandbox with our flags on this machine."""
    if shutil.which("bwrap") is None:
        return False
    try:
        probe = subprocess.run(
            [*_bwrap_command(), "-c", "print('ok')"], capture_output=True, timeout=30, text=True
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == "ok"


def _bwrap_command() -> list[str]:
    python, binds = _python_in_sandbox()
    root = os.getuid() == 0
    args = ["bwrap", "--die-with-parent", "--new-session"]
    if root:  # no user namespace: stay real root just long enough to drop to a random uid
        args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all"]
    args += [
        *_system_binds(),
        *binds,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
    ]
    args += ["--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    args += ["--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1", python, "-I", "-S"]
    return args


def default_sandbox() -> str:
    """ "bwrap" if usable here, else "rlimit"."""
    return "bwrap" if bwrap_available() else "rlimit"


def _parse_report(line: bytes) -> dict:
    """One runner line (`repr` of a dict of plain values), parsed without evaluating code."""
    value = ast.literal_eval(line.decode("utf-8", "replace"))
    if not isinstance(value, dict):
        raise SandboxError(f"malformed runner report: {line[:200]!r}")
    return value


@dataclass(frozen=True)
class RawRun:
    """What the runner reported: one dict per test that finished, plus how the run ended.

    `isolation` is the runner's start report: {"uid", "net_isolated", "fs_readonly",
    "proc_private", "no_new_privs"} (all but uid None under bwrap, which does all of it
    itself), or {} when the runner never started.

    `machine_limit` says when the run ended early for the machine's sake, not the program's:
    "sandbox_start" (no runner started, after `START_RETRIES` fresh ones; or the fallback has no
    interpreter it may run) or "test_timeout" (the run passed its overall wall-clock deadline).
    """

    tests: list[dict]
    sandbox: str
    runner_error: str | None
    isolation: dict = field(default_factory=dict)
    machine_limit: str | None = None


def run_in_sandbox(
    program: str,
    mode: str,
    inputs: list,
    *,
    fn_name: str | None = None,
    limits: Limits = Limits(),
    sandbox: str | None = None,
) -> RawRun:
    """Run `program` once per input inside the sandbox; expected outputs are not passed in."""
    kind = sandbox or default_sandbox()
    if kind not in SANDBOX_KINDS:
        raise ValueError(f"sandbox must be one of {SANDBOX_KINDS}, got {kind!r}")
    if kind == "bwrap" and not bwrap_available():
        raise SandboxError("bubblewrap requested but `bwrap` is missing or cannot create namespaces here")
    # As root, tests run under a fresh unprivileged uid (RLIMIT_NPROC is not enforced for
    # root). The fallback refuses to run at all when it cannot drop privileges.
    if kind == "rlimit" and fallback_python().path is None:
        return RawRun([], kind, fallback_python().reason, machine_limit="sandbox_start")
    uid = fresh_uid() if os.getuid() == 0 else None
    job = {
        "program": program,
        "mode": mode,
        "fn_name": fn_name,
        "inputs": inputs,
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "max_output": limits.max_output,
        "nproc": limits.nproc,
        "fsize_mb": limits.fsize_mb,
        "nofile": limits.nofile,
        "uid": uid,
        # after each test: the whole PID namespace, or (fallback as root) the fresh uid
        "kill_all": "namespace" if kind == "bwrap" else ("uid" if uid is not None else None),
        "isolate": kind == "rlimit",
    }
    scratch_dir = None
    if kind == "rlimit":
        scratch_dir = os.path.realpath(tempfile.mkdtemp(prefix="verifiers-scratch-"))
        os.chmod(scratch_dir, 0o700)
        if uid is not None:
            os.chown(scratch_dir, uid, uid)
        job["scratch"] = scratch_dir
    clean = False
    try:
        raw = _drive(_SPARES.take(kind), job, kind, len(inputs), limits)
        for _ in range(START_RETRIES):  # a runner that never reported ready ran nothing: start another
            if raw.runner_error is None or raw.isolation:
                break
            raw = _drive(_start_runner(kind), job, kind, len(inputs), limits)
        clean = raw.runner_error is None
        if raw.runner_error is not None and not raw.isolation:  # no runner ever started: the machine's
            raw = dataclasses.replace(raw, machine_limit="sandbox_start")
        return raw
    finally:
        if kind == "rlimit" and uid is not None and not clean:
            _kill_uid(uid)  # the runner died before its own per-test cleanup
        if scratch_dir is not None:
            shutil.rmtree(scratch_dir, ignore_errors=True)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` from a helper that runs as `uid`.

    Only the rlimit fallback needs it: its tests are not in a PID namespace, so a program
    that kills its runner would leave its background processes running under the fresh uid.
    Pitfall: kill(-1) as root signals every process on the machine, so this refuses any
    uid outside `UID_RANGE` and the helper re-checks that it is not root before killing.
    """
    if not UID_RANGE[0] <= uid < UID_RANGE[1]:
        return
    python = fallback_python().path
    if python is None:
        return
    script = "import os\nif 0 not in os.getresuid():\n    os.kill(-1, 9)"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [python, "-I", "-S", "-c", script],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            timeout=30,
            capture_output=True,
        )


def _start_runner(kind: str) -> subprocess.Popen:
    if kind == "bwrap":
        command = [*_bwrap_command(), "-c", RUNNER_SOURCE]
    else:
        python = fallback_python().path
        if python is None:  # run_in_sandbox never asks for one then
            raise SandboxError(fallback_python().reason)
        command = [python, "-I", "-S", "-c", RUNNER_SOURCE]
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd="/",
    )


class _SparePool:
    """Runners started ahead of time; `take` hands one out and a refill thread replaces it.

    Pitfall: bwrap's `--die-with-parent` is PR_SET_PDEATHSIG, which fires when the *thread*
    that started the runner exits, not its process. Spares started from a short-lived thread
    died with it, sometimes after `take` had handed them out: "sandbox failed to start" with
    an empty stderr, a correct program scored 0, and an honest worker's claimed reward no
    longer matching the validator's. So all spares come from one long-lived thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spares: dict[str, list[subprocess.Popen]] = {}
        self._pid = os.getpid()
        self._wanted: queue.SimpleQueue[str] | None = None

    def take(self, kind: str) -> subprocess.Popen:
        with self._lock:
            if self._pid != os.getpid():  # forked: the spares and the refill thread belong to the parent
                self._spares, self._pid, self._wanted = {}, os.getpid(), None
            spares = self._spares.setdefault(kind, [])
            proc = None
            while spares and proc is None:
                candidate = spares.pop()
                if candidate.poll() is None:
                    proc = candidate
                else:
                    _discard(candidate)
            if self._wanted is None:
                self._wanted = queue.SimpleQueue()
                refill = threading.Thread(
                    target=self._refill_forever, args=(self._wanted,), name="verifiers-sandbox-spares", daemon=True
                )
                refill.start()
            self._wanted.put(kind)
        return proc if proc is not None else _start_runner(kind)

    def _refill_forever(self, wanted: queue.SimpleQueue[str]) -> None:
        while True:
            kind = wanted.get()
            with self._lock:
                missing = SPARES - len(self._spares.get(kind, []))
            for _ in range(max(0, missing)):
                proc = _start_runner(kind)
                with self._lock:
                    self._spares.setdefault(kind, []).append(proc)

    def close(self) -> None:
        with self._lock:
            spares, self._spares = self._spares, {}
        for procs in spares.values():
            for proc in procs:
                _discard(proc)


def _discard(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


_SPARES = _SparePool()
atexit.register(_SPARES.close)


def _drive(proc: subprocess.Popen, job: dict, kind: str, n_tests: int, limits: Limits) -> RawRun:
    deadline = time.monotonic() + 30.0 + n_tests * (limits.timeout_s + 1.0)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    tests: list[dict] = []
    error = None
    machine_limit = None
    isolation: dict = {}
    try:
        try:
            proc.stdin.write(marshal.dumps(job))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        buffer = b""
        fd = proc.stdout.fileno()
        ready_seen = False
        while len(tests) < n_tests and error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = "sandbox exceeded its overall deadline"
                machine_limit = "test_timeout"
                break
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                error = "runner exited early (killed by the program?)"
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = _parse_report(line)
                if not ready_seen:
                    ready_seen = True
                    isolation = {k: v for k, v in message.items() if k != "ready"}
                    _warn_if_weak(kind, isolation)
                    if job["uid"] is not None and message.get("uid") != job["uid"]:
                        error = f"runner did not drop privileges (uid {message.get('uid')})"
                        break
                    continue
                tests.append(message)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        stderr = proc.stderr.read(4096) if error else b""
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    if error and not ready_seen:
        error = f"sandbox failed to start: {stderr.decode('utf-8', 'replace').strip()[:500]}"
    return RawRun(tests, kind, error, isolation, machine_limit)


_WARNED: set[str] = set()


def _warn_if_weak(kind: str, isolation: dict) -> None:
    """Log once per kind of gap when the root fallback could not build its namespaces."""
    if kind != "rlimit" or os.getuid() != 0:
        return
    missing = [
        k for k in ("net_isolated", "fs_readonly", "proc_private", "no_new_privs") if not isolation.get(k)
    ]
    message = f"rlimit sandbox as root runs without {', '.join(missing)} (kernel refused); use bubblewrap"
    if missing and message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("verifiers.code").warning(message)
