"""The HTTP server: Range, whitelist, auth, and concurrency (an idle or slow peer blocks no one)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import requests

from shardcast import Origin
from shardcast.layout import DataDir
from shardcast.publish import publish_file
from shardcast.server import HttpServer


@pytest.fixture
def served(tmp_path: Path, payload: Path):  # type: ignore[no-untyped-def]
    store = DataDir(tmp_path / "origin")
    publish_file(store, payload, shard_size=64 * 1024)
    with HttpServer(store) as server:
        yield server, store


def test_range_and_keep_alive(served) -> None:  # type: ignore[no-untyped-def]
    server, store = served
    shard = store.shard_path(1, 0).read_bytes()
    with requests.Session() as session:
        full = session.get(f"{server.url}/v1/shard_000000.bin")
        assert full.status_code == 200 and full.content == shard
        part = session.get(f"{server.url}/v1/shard_000000.bin", headers={"Range": "bytes=100-199"})
        assert part.status_code == 206 and part.content == shard[100:200]
        tail = session.get(f"{server.url}/v1/shard_000000.bin", headers={"Range": "bytes=65000-"})
        assert tail.status_code == 206 and tail.content == shard[65000:]
        assert part.headers.get("Connection", "keep-alive").lower() != "close"


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v1/",
        "/.staging/lock",
        "/v1/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/v1/shard_0.bin",
        "/v1/shard_000099.bin",
    ],
)
def test_only_whitelisted_files_are_served(served, path: str) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 404"), response[:80]


def test_symlink_escaping_root_is_not_served(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, store = served
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (store.version_dir(7)).mkdir()
    (store.version_dir(7) / "manifest.json").symlink_to(secret)
    assert requests.get(f"{server.url}/v7/manifest.json").status_code == 404


def test_bearer_token(tmp_path: Path, payload: Path) -> None:
    with Origin(tmp_path / "o", port=0, token="s3cret") as origin:
        origin.publish(payload)
        assert requests.get(f"{origin.url}/index.json").status_code == 401
        assert (
            requests.get(f"{origin.url}/index.json", headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        ok = requests.get(f"{origin.url}/index.json", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and b'"version": 1' in ok.content


def test_idle_and_slow_peers_do_not_block_others(tmp_path: Path, payload: Path) -> None:
    """The reference served one request at a time: an idle socket stalled every other client."""
    with Origin(tmp_path / "o", port=0, shard_size=1 << 20, rate_limit_bps=20_000) as origin:
        origin.publish(payload)
        idle = socket.create_connection(("127.0.0.1", origin.server.port))  # connects, sends nothing
        slow = socket.create_connection(("127.0.0.1", origin.server.port))
        slow.sendall(b"GET /v1/shard_000000.bin HTTP/1.1\r\nHost: x\r\n\r\n")  # ~50 s at 20 kB/s, never read
        done = threading.Event()

        def fast() -> None:
            response = requests.get(f"{origin.url}/v1/manifest.json", timeout=20)
            assert response.status_code == 200
            done.set()

        worker = threading.Thread(target=fast)
        worker.start()
        worker.join(30)
        assert done.is_set(), "a fast request was blocked by an idle and a slow peer"
        idle.close()
        slow.close()
