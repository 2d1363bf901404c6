"""What a user meets when something is wrong: no silent waits, one-line errors, no tracebacks.

Each test is one finding of a new-user trial (issue 14, items 6, 7 and 9).
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardcast import Client, MissingExtraError, NoServerAvailableError, Origin, Relay
from shardcast.cli import main
from shardcast.remote import normalise_url

# ---- item 6: a fetch whose only server dies says so, and gives up -------------------------------


def test_fetch_from_a_dead_server_logs_what_it_waits_for_and_gives_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: silent for 335 s at DEBUG (3600 s deadline, 6 back-off attempts per shard).
    monkeypatch.setattr("shardcast.transfer.STATUS_LOG_S", 0.3)
    model = write_random(tmp_path / "model.bin", 2_000_000, seed=1)
    origin = Origin(tmp_path / "origin", port=0, shard_size=100_000, rate_limit_bps=500_000).start()
    origin.publish(model)
    first_shard = threading.Event()

    def kill_origin() -> None:
        first_shard.wait(30)
        origin.stop()

    killer = threading.Thread(target=kill_origin)
    killer.start()
    caplog.set_level(logging.INFO, logger="shardcast")
    try:
        with pytest.raises(NoServerAvailableError) as raised:
            Client([origin.url], concurrency=2).fetch(
                1,
                tmp_path / "out.bin",
                deadline_s=600,  # the stall timeout, not the deadline, must end it
                stall_timeout_s=2,
                progress=lambda p: p.shards_done >= 1 and first_shard.set(),
            )
    finally:
        killer.join()
        origin.stop()
    message = str(raised.value)
    assert "no server has answered for" in message and "\n" not in message
    assert f"{origin.url}: unreachable" in message and "Connection refused" in message
    lines = [r.getMessage() for r in caplog.records if r.name == "shardcast.transfer"]
    assert any(line.startswith(f"{origin.url} failed: ") for line in lines), lines
    waiting = [line for line in lines if "waiting for" in line]
    assert waiting and f"{origin.url}: unreachable, next try in" in waiting[-1]


def test_unreachable_server_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert main(["fetch", "--servers", f"127.0.0.1:{port}", "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"shardcast fetch: error: NoServerAvailableError: no server gave a usable index: "
        f"http://127.0.0.1:{port} unreachable: cannot connect to 127.0.0.1:{port} (Connection refused)"
    )


# ---- item 7: wrong argument types and missing extras ------------------------------------------


def test_client_refuses_a_single_string_and_bad_urls() -> None:
    with pytest.raises(TypeError, match=r"write Client\(\['http://host:8000'\]\)"):
        Client("http://host:8000")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not one string"):
        Relay("http://host:8000", "/nonexistent")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad server URL 'http://host:abc'"):
        Client(["http://host:abc"])
    with pytest.raises(ValueError, match="expected http://host:port"):
        normalise_url("ftp://host:21")
    assert Client(["host:8000/", "http://host:8000"]).servers == ["http://host:8000"]


def test_origin_port_and_host_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="port must be an int"):
        Origin(tmp_path, port="abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"port must be in 0\.\.65535"):
        Origin(tmp_path, port=70000)
    # 192.0.2.1 (TEST-NET-1) is on no interface here: binding fails locally, nothing is sent.
    with pytest.raises(OSError, match=r"cannot listen on 192\.0\.2\.1:0: .*assign requested address"):
        Origin(tmp_path, host="192.0.2.1", port=0).start()


def _without_cryptography(args: list[str]) -> subprocess.CompletedProcess[str]:
    # `None` in sys.modules makes `import cryptography` raise ModuleNotFoundError, as when
    # the extra is not installed.
    code = (
        "import sys; sys.modules['cryptography'] = None; from shardcast.cli import main; "
        f"raise SystemExit(main({args!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args",
    [["keygen"], ["publish", "--data-dir", "DATA", "--key", "ed25519-private:" + "11" * 32, "FILE"]],
    ids=["keygen", "publish-ed25519"],
)
def test_ed25519_without_cryptography_names_the_extra(tmp_path: Path, args: list[str]) -> None:
    model = write_random(tmp_path / "model.bin", 1000)
    args = [a.replace("DATA", str(tmp_path / "data")).replace("FILE", str(model)) for a in args]
    done = _without_cryptography(args)
    assert done.returncode == 1
    assert done.stdout == ""  # keygen printed the private key before failing
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "MissingExtraError" in done.stderr and 'pip install "intellect2-shardcast[ed25519]"' in done.stderr
    assert not (tmp_path / "data").exists()  # publish failed before writing anything


def test_missing_extra_is_an_import_error_and_a_shardcast_error() -> None:
    assert issubclass(MissingExtraError, ImportError)


# ---- item 9: a corrupt index is called corrupt --------------------------------------------------


def test_ls_calls_a_corrupt_index_corrupt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Origin(tmp_path / "o", port=0) as origin:
        origin.publish(write_random(tmp_path / "m.bin", 1000))
        (tmp_path / "o" / "index.json").write_text('{"format": "shardcast-index/1", "versions": "x"}')
        assert main(["ls", "--servers", origin.url]) == 1
        err = capsys.readouterr().err
        assert f"{origin.url}: corrupt index: " in err and "unreachable" not in err
        assert main(["ls", "--servers", origin.url, "--json"]) == 1
        errors = json.loads(capsys.readouterr().out)["errors"]
        assert errors[origin.url].startswith("corrupt index: ")


def test_cli_user_errors_never_print_a_traceback(tmp_path: Path) -> None:
    cases = [
        ["publish", "--data-dir", str(tmp_path / "d"), str(tmp_path / "missing.bin")],
        ["fetch", "--servers", "http://host:abc", "--output", str(tmp_path / "o")],
        ["publish", "--data-dir", str(tmp_path / "d"), "--key", "rsa:x", str(tmp_path / "x")],
    ]
    for args in cases:
        done = subprocess.run(
            [sys.executable, "-m", "shardcast.cli", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.startswith(f"shardcast {args[0]}: error: "), done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_ls_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    # `shardcast ls | head`: the reader has gone before ls writes (its end is closed here).
    read_end, write_end = os.pipe()
    os.close(read_end)
    with Origin(tmp_path / "o", port=0) as origin:
        origin.publish(write_random(tmp_path / "m.bin", 1000))
        done = subprocess.run(
            [sys.executable, "-m", "shardcast.cli", "ls", "--servers", origin.url],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    os.close(write_end)
    assert done.returncode == 1
    assert done.stderr == "", done.stderr


def write_random(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
