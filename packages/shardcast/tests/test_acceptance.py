"""Acceptance tests from the issue: real `shardcast` processes talking over loopback sockets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from shardcast_testlib import make_manifest  # type: ignore[import-not-found]

from conftest import files_equal, wait_until, write_random  # type: ignore[import-not-found]

CLI = [sys.executable, "-m", "shardcast.cli"]
MB = 1_000_000


class Service:
    """A long-running `shardcast origin|relay` process; its URL is read from its first stdout line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, *args, "--port", "0", "--host", "127.0.0.1", "--log-level", "INFO"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if " on http://" not in line:
            self.proc.kill()
            raise AssertionError(f"service did not start: {line!r} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url = line.strip().rsplit(" on ", 1)[1]

    def index(self) -> dict:  # type: ignore[type-arg]
        response = requests.get(f"{self.url}/index.json", timeout=10)
        return response.json() if response.status_code == 200 else {}

    def complete(self, version: int) -> bool:
        return any(v["version"] == version and v["complete"] for v in self.index().get("versions", []))

    def listed(self, version: int) -> bool:
        return any(v["version"] == version for v in self.index().get("versions", []))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stderr.read()  # type: ignore[union-attr]


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        if service.proc.poll() is None:
            service.proc.kill()
            service.proc.wait()


def start(services: list[Service], *args: str) -> Service:
    service = Service(*args)
    services.append(service)
    return service


def fetch(servers: list[str], output: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "fetch", "--servers", ",".join(servers), "--output", str(output), "--no-progress", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def publish(data_dir: Path, file: Path, *extra: str) -> str:
    out = subprocess.run(
        [*CLI, "publish", "--data-dir", str(data_dir), str(file), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout, stderr


def test_tree_origin_relay_relay_four_clients(tmp_path: Path, services: list[Service]) -> None:
    model = write_random(tmp_path / "model.safetensors", 64 * 2**20, seed=21)
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"), "--rate-limit", "2M")
    relay1 = start(
        services,
        "relay",
        "--upstream",
        origin.url,
        "--data-dir",
        str(tmp_path / "r1"),
        "--poll-interval",
        "0.1",
    )
    relay2 = start(
        services,
        "relay",
        "--upstream",
        relay1.url,
        "--data-dir",
        str(tmp_path / "r2"),
        "--poll-interval",
        "0.1",
    )
    publish(tmp_path / "origin", model, "--shard-size", "1Mi")
    states = []

    def relay2_serves_shard() -> bool:
        if requests.get(f"{relay2.url}/v1/shard_000000.bin", timeout=10).status_code != 200:
            return False
        states.append(relay1.complete(1))  # asked after relay 2 answered 200
        return True

    wait_until(relay2_serves_shard, timeout=60, what="relay 2 serving a shard")
    assert states == [False], "relay 2 served shards only after relay 1 had the whole version"
    clients = [
        fetch([relay2.url], tmp_path / f"client{i}" / "model.safetensors", "--deadline", "120")
        for i in range(4)
    ]
    for proc in clients:
        code, stdout, stderr = finish(proc)
        assert code == 0, stderr
        assert "v1 ->" in stdout
    for i in range(4):
        assert files_equal(tmp_path / f"client{i}" / "model.safetensors", model)
    logs = relay2.stop()
    assert "mirrored v1" in logs


def test_relay_killed_mid_transfer(tmp_path: Path, services: list[Service]) -> None:
    model = write_random(tmp_path / "model.bin", 16 * MB, seed=22)
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"))
    publish(tmp_path / "origin", model, "--shard-size", "512K")
    relays = [
        start(
            services,
            "relay",
            "--upstream",
            origin.url,
            "--data-dir",
            str(tmp_path / name),
            "--poll-interval",
            "0.1",
            "--rate-limit",
            "500K",
        )
        for name in ("ra", "rb")
    ]
    for relay in relays:
        wait_until(lambda r=relay: r.complete(1), timeout=60, what="relays mirrored")
    output = tmp_path / "out" / "model.bin"
    output.parent.mkdir()
    client = fetch([r.url for r in relays], output, "--deadline", "120", "--log-level", "INFO")
    wait_until(lambda: (output.parent / "model.bin.partial.json").exists(), what="client mid-download")
    relays[0].proc.kill()
    code, _, stderr = finish(client)
    assert code == 0, stderr
    assert files_equal(output, model)
    assert f"server {relays[1].url}" in stderr


def test_client_killed_and_restarted_resumes(tmp_path: Path, services: list[Service]) -> None:
    model = write_random(tmp_path / "model.bin", 8 * MB, seed=23)
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"), "--rate-limit", "400K")
    publish(tmp_path / "origin", model, "--shard-size", "1M")
    output = tmp_path / "worker" / "model.bin"
    journal = tmp_path / "worker" / "model.bin.partial.json"
    first = fetch([origin.url], output, "--concurrency", "4")

    def some_progress() -> bool:
        try:
            state = json.loads(journal.read_text())
        except (OSError, ValueError):
            return False
        return sum(state["partial"].values()) + MB * len(state["done"]) >= 2 * MB

    wait_until(some_progress, timeout=60, what="2 MB downloaded")
    first.kill()
    first.wait()
    assert not output.exists()
    code, stdout, stderr = finish(fetch([origin.url], output, "--concurrency", "8"))
    assert code == 0, stderr
    resumed = int(stdout.split("resumed ")[1].split(",")[0])
    downloaded = int(stdout.split("downloaded ")[1].split(",")[0])
    assert resumed >= 2 * MB and downloaded + resumed == 8 * MB, stdout
    assert files_equal(output, model)


def test_slow_client_does_not_slow_a_fast_one(tmp_path: Path, services: list[Service]) -> None:
    model = write_random(tmp_path / "model.bin", 16 * MB, seed=24)
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"))
    publish(tmp_path / "origin", model, "--shard-size", "1M")
    slow = fetch([origin.url], tmp_path / "slow.bin", "--rate-limit", "100K")  # would need ~160 s
    try:
        wait_until(lambda: (tmp_path / "slow.bin.partial.json").exists(), what="slow client started")
        code, _, stderr = finish(fetch([origin.url], tmp_path / "fast.bin"), timeout=60)
        assert code == 0, stderr
        assert slow.poll() is None, "the slow client finished first?"
        assert files_equal(tmp_path / "fast.bin", model)
    finally:
        slow.kill()
        slow.wait()


def test_version_deleted_upstream_fails_within_deadline(tmp_path: Path, services: list[Service]) -> None:
    model = write_random(tmp_path / "model.bin", 4 * MB, seed=25)
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"), "--keep", "1", "--grace", "0")
    publish(tmp_path / "origin", model, "--shard-size", "256K", "--keep", "1", "--grace", "0")
    started = time.monotonic()
    client = fetch(
        [origin.url], tmp_path / "out.bin", "--rate-limit", "200K", "--deadline", "60", "--version", "1"
    )
    wait_until(lambda: (tmp_path / "out.bin.partial.json").exists(), what="download started")
    publish(tmp_path / "origin", model, "--shard-size", "256K", "--keep", "1", "--grace", "0")
    code, _, stderr = finish(client, timeout=90)
    assert code == 1
    assert "VersionGoneError" in stderr and "version 1 is no longer listed" in stderr, stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out.bin").exists()


def test_hostile_manifest_is_rejected_by_cli(tmp_path: Path, services: list[Service]) -> None:
    hostile = tmp_path / "hostile"
    (hostile / "v1").mkdir(parents=True)
    (hostile / "index.json").write_text(
        json.dumps({"format": "shardcast-index/1", "versions": [{"version": 1, "complete": True}]})
    )
    obj = json.loads(make_manifest(version=1).to_json())
    obj.update({"file_name": "../../outside", "file_size": 10**15, "shard_size": 1})
    (hostile / "v1" / "manifest.json").write_text(json.dumps(obj))
    origin = start(services, "origin", "--data-dir", str(hostile))
    code, _, stderr = finish(fetch([origin.url], tmp_path / "out.bin"))
    assert code == 1 and "ManifestError" in stderr, stderr
    relay = start(
        services,
        "relay",
        "--upstream",
        origin.url,
        "--data-dir",
        str(tmp_path / "relay"),
        "--poll-interval",
        "0.1",
    )
    time.sleep(1.0)  # let it poll a few times
    logs = relay.stop()
    assert "rejecting v1" in logs
    assert not (tmp_path / "outside").exists()
    index = (
        json.loads((tmp_path / "relay" / "index.json").read_text())
        if (tmp_path / "relay" / "index.json").exists()
        else {}
    )
    assert index.get("versions", []) == []
    assert sorted(p.name for p in (tmp_path / "relay").iterdir()) in (
        [".staging"],
        [".staging", "index.json"],
    )


@pytest.mark.parametrize("command", ["origin", "publish", "relay", "ls", "fetch"])
def test_every_command_has_help(command: str) -> None:
    out = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: shardcast " + command in out.stdout


def test_ls_and_usage_errors(tmp_path: Path, services: list[Service]) -> None:
    origin = start(services, "origin", "--data-dir", str(tmp_path / "origin"))
    publish(tmp_path / "origin", write_random(tmp_path / "m.bin", 1000))
    out = subprocess.run(
        [*CLI, "ls", "--servers", origin.url, "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and json.loads(out.stdout)["complete"] == {"1": [origin.url]}
    out = subprocess.run([*CLI, "ls", "--servers", "127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no server reachable" in out.stderr
    out = subprocess.run([*CLI, "fetch", "--servers", origin.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--output" in out.stderr
    out = subprocess.run(
        [*CLI, "publish", "--data-dir", str(tmp_path / "o"), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "not a regular file" in out.stderr
    assert os.environ.get("SHARDCAST_TOKEN") is None
