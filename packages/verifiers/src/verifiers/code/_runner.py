"""Sandbox-side test runner (stdlib only; its source is passed to `python -I -S -c`, with
`_runner_isolation.py`, the privilege drop and namespace fallback, inlined at its import).

Reads one marshal-encoded job on stdin: {"program", "mode": "stdio"|"call", "fn_name",
"inputs", "timeout_s", "memory_mb", "max_output", "nproc", "fsize_mb", "nofile", "uid",
"kill_all", "isolate", "scratch"} and prints one `repr(dict)` line per test (the host reads it
with `ast.literal_eval`). Only builtin/C modules are imported (no json, enum, traceback),
which keeps interpreter startup to a few milliseconds. For each input it forks a child that sets its own rlimits and new session,
then runs the program; the runner enforces the wall deadline and output cap, kills the
child's whole process tree, and prints one JSON line per test. Expected outputs never
reach this process: the host compares.
"""

import _signal as signal
import marshal
import os
import resource
import select
import sys
import time

# sandbox.RUNNER_SOURCE replaces the next line with the source of _runner_isolation.py.
from verifiers.code._runner_isolation import _drop_privileges, _isolate, _no_new_privs, _prctl_not_dumpable

# Wakes the runner's select() when a test child exits (set up in main, see run_one).
_WAKE_R = _WAKE_W = -1


def _child(job, index, scratch, in_fd, out_w, err_w, res_w):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    if job["uid"] is not None and 0 in os.getresuid():  # never run untrusted code as root
        os._exit(70)
    limits = [
        (resource.RLIMIT_CPU, int(job["timeout_s"]) + 1),
        (resource.RLIMIT_FSIZE, job["fsize_mb"] * 1024 * 1024),
        (resource.RLIMIT_NOFILE, job["nofile"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, job["nproc"]),
    ]
    if job["memory_mb"] > 0:
        limits.append((resource.RLIMIT_AS, job["memory_mb"] * 1024 * 1024))
    for which, value in limits:
        try:  # noqa: SIM105 - contextlib would cost an import in every sandbox
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    os.dup2(in_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(res_w, 3)
    os.closerange(4, 1 << 16)
    os.chdir(scratch)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (lives until os._exit)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    code = 0
    try:
        namespace: dict = {"__name__": "__main__" if job["mode"] == "stdio" else "solution"}
        exec(compile(job["program"], "<solution>", "exec"), namespace)
        if job["mode"] == "call":
            name = job["fn_name"]
            fn = namespace.get(name)
            if fn is None and "Solution" in namespace:
                fn = getattr(namespace["Solution"](), name)
            if fn is None:
                raise NameError(f"function {name!r} not defined")
            result = fn(*job["inputs"][index])
            os.write(3, repr(result).encode())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        code = 137
    except BaseException:
        sys.excepthook(*sys.exc_info())  # prints the traceback without importing traceback
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)


def _kill_tree(pid, kill_all):
    """SIGKILL the test's session; with `kill_all`, every process we may signal.

    kill_all "namespace" (bubblewrap): alone in a PID namespace, everything but us and init.
    kill_all "uid" (fallback as root): every process of our fresh uid, i.e. of this run,
    including ones that left the session. kill(-1) never signals the caller itself; as root
    it would signal the whole host, so it is never sent as uid 0.
    """
    if kill_all == "namespace" or (kill_all == "uid" and os.getuid() != 0):
        try:  # noqa: SIM105
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    try:  # noqa: SIM105
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _wait_namespace_empty(limit_s=2.0):
    """SIGKILL is asynchronous: wait until every process but init and us is really gone."""
    me = os.getpid()
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        _reap()
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return
        try:  # noqa: SIM105
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.001)


def _wait_uid_empty(limit_s=2.0):
    """Until we have no child left. As child subreaper we inherit every orphan of the test,
    so this means every process of the run is dead and reaped. (kill(-1) cannot tell:
    outside a PID namespace it counts processes it may not signal and never says ESRCH.)"""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        if os.getuid() != 0:
            try:  # noqa: SIM105
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _drain(fd, buffers, caps, err_r, open_fds):
    """Read one chunk from fd into its buffer; True if the output cap was exceeded."""
    chunk = os.read(fd, 65536)
    if not chunk:
        open_fds.discard(fd)
        return False
    buf = buffers[fd]
    buf += chunk
    if fd == err_r:
        del buf[: max(0, len(buf) - caps[fd])]
        return False
    return len(buf) > caps[fd]


def _remove_tree(path):
    """rm -rf without importing shutil (the test's processes are already dead)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:  # noqa: SIM105
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            full = os.path.join(root, name)
            try:
                if os.path.islink(full):
                    os.unlink(full)
                else:
                    os.rmdir(full)
            except OSError:
                pass
    try:  # noqa: SIM105
        os.rmdir(path)
    except OSError:
        pass


def run_one(job, index, base_scratch):
    # every test gets its own empty working directory, removed afterwards
    scratch = os.path.join(base_scratch, f"test-{index}")
    os.mkdir(scratch, 0o700)
    stdin_path = os.path.join(base_scratch, f".stdin-{index}")
    if job["mode"] == "stdio":
        with open(stdin_path, "w") as f:
            f.write(job["inputs"][index])
        in_fd = os.open(stdin_path, os.O_RDONLY)
        os.unlink(stdin_path)
    else:
        in_fd = os.open(os.devnull, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        for fd in (out_r, err_r, res_r, _WAKE_R, _WAKE_W):
            os.close(fd)
        _child(job, index, scratch, in_fd, out_w, err_w, res_w)
    for fd in (in_fd, out_w, err_w, res_w):
        os.close(fd)
    buffers = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    caps = {out_r: job["max_output"], err_r: 4096, res_r: job["max_output"]}
    open_fds = set(buffers)
    status = None
    exit_code = None
    deadline = start + job["timeout_s"]
    # Done when the child has exited (its pipes may be held open by a background process
    # it spawned; that one is killed below) or when the deadline passes.
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            status = "timeout"
            break
        ready, _, _ = select.select([*open_fds, _WAKE_R], [], [], remaining)
        for fd in ready:
            if fd == _WAKE_R:
                try:  # noqa: SIM105
                    os.read(_WAKE_R, 4096)
                except BlockingIOError:
                    pass
                continue
            if _drain(fd, buffers, caps, err_r, open_fds):
                status = "output_limit"
        if status == "output_limit":
            break
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            exit_code = os.waitstatus_to_exitcode(raw)
            for fd in list(open_fds):  # whatever is already in the pipes
                os.set_blocking(fd, False)
                while fd in open_fds:
                    try:
                        if _drain(fd, buffers, caps, err_r, open_fds):
                            status = "output_limit"
                            break
                    except BlockingIOError:
                        break
            break
    _kill_tree(pid, job["kill_all"])
    if exit_code is None:
        try:
            _, raw = os.waitpid(pid, 0)
            exit_code = os.waitstatus_to_exitcode(raw)
        except ChildProcessError:
            exit_code = -9
    _reap()
    if job["kill_all"] == "namespace":
        _wait_namespace_empty()
    elif job["kill_all"] == "uid":
        _wait_uid_empty()
    _remove_tree(scratch)
    for fd in buffers:
        os.close(fd)
    stderr_tail = buffers[err_r].decode("utf-8", "replace")
    if status is None:
        if exit_code == -signal.SIGXCPU or exit_code == -signal.SIGKILL:
            status = "timeout" if exit_code == -signal.SIGXCPU else "killed"
        elif exit_code == 137 or "MemoryError" in stderr_tail:
            status = "memory"
        elif exit_code != 0:
            status = "runtime_error"
        else:
            status = "ok"
    return {
        "index": index,
        "status": status,
        "exit_code": exit_code,
        "stdout": buffers[out_r][: job["max_output"]].decode("utf-8", "replace"),
        "result": buffers[res_r].decode("utf-8", "replace") if job["mode"] == "call" else None,
        "stderr_tail": stderr_tail[-1000:],
        "wall_s": time.monotonic() - start,
    }


def main():
    global _WAKE_R, _WAKE_W
    _WAKE_R, _WAKE_W = os.pipe()
    os.set_blocking(_WAKE_W, False)
    os.set_blocking(_WAKE_R, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(_WAKE_W)
    job = marshal.loads(sys.stdin.buffer.read())
    os.close(0)
    scratch = job.get("scratch") or "/tmp"
    ready: dict = {"ready": True, "net_isolated": None, "fs_readonly": None, "proc_private": None}
    if job.get("isolate"):  # the rlimit fallback (bubblewrap already did all of this)
        ready.update(_isolate(scratch))
    uid = job.get("uid")
    if uid is not None:
        _drop_privileges(uid)
    else:
        _prctl_not_dumpable()
    ready["no_new_privs"] = _no_new_privs() if job.get("isolate") else None
    ready["uid"] = os.getuid()
    out = sys.stdout
    out.write(repr(ready) + "\n")
    out.flush()
    for index in range(len(job["inputs"])):
        out.write(repr(run_one(job, index, scratch)) + "\n")
        out.flush()


if __name__ == "__main__":  # run as `python -c <this source>`
    main()
