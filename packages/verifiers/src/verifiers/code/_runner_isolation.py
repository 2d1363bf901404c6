"""Sandbox-side process hardening for `_runner.py` (stdlib only, Linux): privilege drop,
no-new-privs, and the namespace fallback (no network, read-only filesystem, private /proc).

Not imported in the sandbox: `sandbox.RUNNER_SOURCE` inlines this file's source in place of
`_runner.py`'s import line, because the runner starts as `python -I -S -c SOURCE` and can
import nothing of ours. Imported normally it is only read (tests, type checks).
"""

import os


def _prctl_not_dumpable():
    # Other processes of the same uid cannot open /proc/<runner>/fd/* or ptrace us (no
    # forged results). A setuid() already did this, so ctypes is only loaded without one.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _die(message):
    """Refuse to run anything: the host sees EOF before "ready" and reports this line."""
    os.write(2, ("sandbox runner: " + message + "\n").encode())
    os._exit(70)


def _drop_privileges(uid):
    """root -> `uid` for good (groups, gid, then uid), verified; aborts the runner otherwise."""
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # also clears the dumpable flag and every capability
    except OSError as exc:
        _die("cannot drop root privileges: " + str(exc))
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        _die("privileges were not fully dropped")
    try:
        os.setuid(0)
    except OSError:
        return
    _die("setuid(0) succeeded after dropping privileges")


def _no_new_privs():
    """PR_SET_NO_NEW_PRIVS (execve can never gain privileges again: setuid binaries, file
    caps) and PR_SET_CHILD_SUBREAPER (orphans of a test are re-parented to us and reaped,
    so `_wait_uid_empty` never waits on zombies). True iff no_new_privs is set."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(36, 1, 0, 0, 0)
        return libc.prctl(38, 1, 0, 0, 0) == 0
    except Exception:
        return False


_NEWNS, _NEWUTS, _NEWIPC, _NEWUSER, _NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x40000000
_RDONLY, _NOSUID, _NODEV, _NOEXEC, _REMOUNT, _BIND, _REC, _PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_KEEP = {b"nosuid": _NOSUID, b"nodev": _NODEV, b"noexec": _NOEXEC, b"noatime": 1024, b"nodiratime": 2048}
_KEEP[b"relatime"] = 1 << 21


def _readonly_except(libc, scratch):
    """In a fresh mount namespace: every mount read-only except a bind mount of `scratch`.

    Existing nosuid/nodev/noexec/atime flags are kept (nosuid is added). True iff every
    remount succeeded. Nothing here is visible outside this runner's mount namespace.
    """
    target = scratch.encode()
    if libc.mount(None, b"/", None, _REC | _PRIVATE, None) != 0:
        return False
    if libc.mount(target, target, None, _BIND, None) != 0:
        return False
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    ok = True
    for line in lines:
        fields = line.split(b" ")
        # mountinfo escapes space, tab, newline and backslash as \\ooo (octal)
        point = fields[4].decode("unicode_escape").encode("latin-1")
        options = fields[5].split(b",")
        if point == target or b"ro" in options:
            continue
        flags = _REMOUNT | _BIND | _RDONLY | _NOSUID
        for name in options:
            flags |= _KEEP.get(name, 0)
        if libc.mount(None, point, None, flags, None) != 0:
            ok = False
    return ok


def _private_proc(libc):
    """A new procfs instance on /proc with hidepid=invisible: our uid sees only its own
    processes. Only on Linux >= 5.8, where each proc mount has its own options (before,
    the options belong to the PID namespace's one superblock and would change the host's)."""
    release = os.uname().release.split(".")
    try:
        if (int(release[0]), int(release[1].split("-")[0])) < (5, 8):
            return False
    except (IndexError, ValueError):
        return False
    flags = _NOSUID | _NODEV | _NOEXEC
    return libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=invisible") == 0


def _isolate(scratch):
    """Fallback isolation without bubblewrap: {"net_isolated", "fs_readonly", "proc_private"}.

    As root: new network, mount, IPC and UTS namespaces, then `_readonly_except(scratch)`
    and `_private_proc`. Not root: a network namespace inside a new user namespace where
    the kernel allows it.
    """
    report = {"net_isolated": False, "fs_readonly": False, "proc_private": False}
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
        if os.getuid() != 0:
            report["net_isolated"] = libc.unshare(_NEWUSER | _NEWNET) == 0
        elif libc.unshare(_NEWNET | _NEWNS | _NEWIPC | _NEWUTS) == 0:
            report["net_isolated"] = True
            report["fs_readonly"] = _readonly_except(libc, scratch)
            report["proc_private"] = _private_proc(libc)
        else:
            report["net_isolated"] = libc.unshare(_NEWNET) == 0
    except Exception:
        pass
    return report
