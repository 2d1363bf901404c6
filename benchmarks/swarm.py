"""Rehearse the swarm: the real roles under ``prime-rl run``, N worker identities, seeded kills.

    python benchmarks/swarm.py --identities 256 --steps 8              # figures -> benchmarks/results/swarm.md
    python benchmarks/swarm.py --identities 256 --kills 20 --seed 1    # chaos, then the invariants
    python benchmarks/swarm.py --identities 16 --think-s 2 --wan       # realistic pace, emulated WAN
    python benchmarks/swarm.py --identities 64 --payload-mb 64 --no-delta  # a 76 MB bf16 policy, full files
    python benchmarks/swarm.py --validators 4 --emulated-prefill-ms-per-token 2  # K validators, emulated GPU-like cost

What runs (everything on this machine, on loopback unless ``--wan`` finds namespaces):
  - ``prime-rl run`` (the supervisor) with a config this script writes: orchestrator, shardcast origin,
    ``--relays`` relays, trainer, validator and no workers of its own, a tiny model built in code
    (``tests/support/tiny_lm.py``) so compute is not what limits the control plane; with
    ``--payload-mb M`` a 4-layer Llama of that tiny family widened until its bf16 file holds M MB,
    trained in fp32 at INTELLECT-2's lr 3e-7 and published in bf16, so versions differ by real bf16
    weight deltas (``--no-delta``: shardcast full files only);
  - ``--hosts`` swarm hosts (``benchmarks/swarm_host.py``), each running its share of the N identities
    on one shared model; every 10th identity (``--hostile-every``) plays a ``redteam/attacks.py`` attack.
With ``--kills K``, once the first policy version is published a seeded schedule SIGKILLs, one every ``--kill-gap-s``
(seeded jitter) or sooner when the run gets ahead (kill ``i`` by step ``1 + i * (steps - 1) // K``, so a
fast run cannot end before its kills), in a seeded rotation: the orchestrator, every validator (``--validators K``:
``validator.count``; more than one needs validator leases, which ``prime-rl run`` checks), trainer, origin, every relay, every
swarm host (restarted here, under the same identities), and cuts one host's link for 2-6 s
(``network.cut``; on loopback the host is stopped with SIGSTOP for that long instead). The supervisor
restarts its children. When the trainer has finished, the invariants of ``swarm_checks.py`` are checked
from the stores; a violation prints its ids and the exit code is 1.

With ``--validators K`` the figures have a ``validators`` part (``swarm_validators.py``): samples judged
per second by all K, batches prefilled or judged twice by cause, the honest expired share;
``--emulated-prefill-ms-per-token`` is BENCHMARK EMULATION (``validator/emulated_cost.py``), and
``swarm_scaling.py`` runs the K = 1, 2, 4 rows.

Results: ``<root>/figures.json`` always; with ``--record`` (the default when ``--root`` is not given)
also a row in ``benchmarks/results/swarm.json`` and the tables of ``swarm.md`` (``swarm_figures.py``).
Everything it starts (the supervisor's session, the hosts) it stops, at exit, on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests" / "support")]

from run_toml import write_run_toml  # noqa: E402
from swarm_checks import RunRecords, check_invariants, read_jsonl  # noqa: E402
from swarm_figures import compute_figures, record_results  # noqa: E402
from swarm_validators import validator_figures  # noqa: E402
from swarm_wan import open_network  # noqa: E402

from prime_rl.config import load_config  # noqa: E402
from prime_rl.launch.groups import stop_groups  # noqa: E402


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


PAYLOAD_LAYERS = 4
PAYLOAD_LR = 3e-7  # INTELLECT-2's AdamW learning rate (configs/intellect2.toml)


def payload_hidden_size(payload_mb: float, layers: int = PAYLOAD_LAYERS) -> int:
    """Hidden size (a multiple of 64) of a ``tiny_lm`` Llama whose bf16 file is at least ``payload_mb``.

    A layer of ``make_tiny_lm`` holds 9 h^2 parameters (q and o h^2 each, k and v h^2/2 each with
    2 of 4 heads as KV heads, gate/up/down 2 h^2 each); the character vocabulary's embeddings add
    about 200 h. At 2 bytes a parameter: 18 h^2 layers + 400 h bytes.
    """
    target = payload_mb * 1e6
    hidden = 64
    while 18 * hidden * hidden * layers + 400 * hidden < target:
        hidden += 64
    return hidden


def write_model(model: Path, args: argparse.Namespace) -> None:
    """The run's model: the 2-layer tiny one, or with ``--payload-mb`` a 4-layer Llama of that bf16 size."""
    import torch
    from tiny_lm import save_tiny_lm

    if (model / "config.json").exists():
        return
    if not args.payload_mb:
        save_tiny_lm(model)
        return
    hidden = payload_hidden_size(args.payload_mb)
    # Saved in bf16 (half the disk); loaded as float32 (model.dtype), so the trainer keeps fp32
    # master weights and each bf16 version differs from the last by what the step moved across
    # bf16's rounding boundaries, as in a real run (trainer.save_dtype = "bfloat16").
    save_tiny_lm(model, hidden_size=hidden, num_layers=PAYLOAD_LAYERS, dtype=torch.bfloat16)


def validator_options(args: argparse.Namespace) -> dict[str, Any]:
    """``[validator]`` settings from ``--batches-per-poll`` and ``--emulated-prefill-ms-per-token``
    (benchmark emulation: a declared floor per prefilled token, ``validator/emulated_cost.py``)."""
    options: dict[str, Any] = {}
    if args.batches_per_poll:
        options["batches_per_poll"] = args.batches_per_poll
    if args.emulated_prefill_ms_per_token:
        options["emulated_prefill_s_per_token"] = args.emulated_prefill_ms_per_token / 1000
    return options


def write_config(root: Path, args: argparse.Namespace, network: Any) -> Path:
    """The run's TOML: a tiny model (or ``--payload-mb``'s), small batches, limits sized for many
    identities at one address."""
    model = root / "model"
    write_model(model, args)
    orchestrator_port, origin_port, trusted_port, *relay_ports = free_ports(3 + args.relays)
    samples_per_step = args.samples_per_step
    sections: dict[str, dict[str, Any]] = {
        "model": {"path": str(model), "dtype": "float32"},
        "tasks": {"num_tasks": 1000, "digits": 1, "seed": args.seed},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 4},
        "orchestrator": {
            "host": network.server_host, "port": orchestrator_port, "async_level": 1, "prompts_per_batch": 2,
            "task_timeout_s": 60.0, "connect_timeout_s": 180.0,
            "admin_token": secrets.token_urlsafe(24),  # binding beyond loopback requires one
            "open_registration": network.emulated,  # identities register from the sites' addresses
            "release_after_tokens": 16, "probation_tokens": 0,
            # Every identity shares this machine's address(es): the per-address limits would cap the
            # swarm at one operator's share; they are tested elsewhere (test_orchestrator_admission).
            "register_rate_per_minute": 0.0, "max_open_leases_per_address": 1 << 20,
            "max_fresh_workers_per_network": 0,
            "max_buffered_samples": 8 * samples_per_step,  # backpressure: the validator's queue stays short
            **({"validator_lease_s": args.validator_lease_s} if args.validator_lease_s else {}),
            **({} if args.lease_judgeable is None else {"lease_judgeable": args.lease_judgeable}),
            **({"trusted_port": trusted_port} if args.trusted_listener else {}),
        },
        "shardcast": {"host": network.server_host, "origin_port": origin_port, "relay_ports": relay_ports, "keep_versions": 5,
                      "delta": args.delta},
        "trainer": {"total_steps": args.steps, "samples_per_step": samples_per_step, "filter_zero_advantage": False,
                    **({"save_dtype": "bfloat16", "lr": args.lr or PAYLOAD_LR} if args.payload_mb else
                       {"lr": args.lr} if args.lr else {})},
        "workers": {"count": 0, "hostile": [], "weights_poll_s": 0.5, "poll_interval_s": 0.5},
        "validator": {"count": args.validators, **validator_options(args)},
        "evaluator": {"enabled": False},
    }  # fmt: skip
    return write_run_toml(root, sections)


class Swarm:
    """The processes of one rehearsal, and their cleanup (module docstring)."""

    def __init__(self, root: Path, config_path: Path, args: argparse.Namespace, network: Any) -> None:
        self.root, self.config_path, self.args, self.network = root, config_path, args, network
        self.config = load_config(config_path)
        self.run_dir = Path(self.config.run_dir)
        self.env = dict(
            os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false"
        )
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.hosts: dict[int, subprocess.Popen[bytes]] = {}
        self.host_starts: dict[int, float] = {}
        self.paused: set[int] = set()  # hosts stopped by a loopback "cut"
        self.kills: list[dict[str, Any]] = []
        self.rss: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.core = -1  # the orchestrator's CPU under ``--pin-orchestrator``

    # -- processes ------------------------------------------------------------------------------
    def _popen(self, argv: list[str], output: Path) -> subprocess.Popen[bytes]:
        with output.open("ab") as handle:
            return subprocess.Popen(
                argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                cwd=REPO, start_new_session=True,
            )  # fmt: skip

    def start_supervisor(self) -> None:
        argv = [sys.executable, "-m", "prime_rl.cli", "run", "--config", str(self.config_path)]
        self.supervisor = self._popen(argv, self.root / "supervisor.out")

    def host_span(self, host: int) -> tuple[int, int]:
        per = -(-self.args.identities // self.args.hosts)
        first = host * per
        return first, max(0, min(per, self.args.identities - first))

    def start_host(self, host: int) -> None:
        first, count = self.host_span(host)
        site = host % self.network.sites()
        config = self.config
        argv = [
            sys.executable, str(REPO / "benchmarks" / "swarm_host.py"), "--config", str(self.config_path),
            "--host", str(host), "--first", str(first), "--count", str(count),
            "--hostile-every", str(self.args.hostile_every), "--think-s", str(self.args.think_s),
            "--seed", str(self.args.seed), "--out", str(self.root),
            "--orchestrator-url", self.network.url(site, config.orchestrator.url),
            "--servers", ",".join(self.network.url(site, url) for url in config.shardcast.client_servers),
        ]  # fmt: skip
        if self.args.host_nice:  # the swarm yields the CPU to the control plane, as on machines of its own
            argv = ["nice", "-n", str(self.args.host_nice), *argv]
        self.hosts[host] = self._popen(self.network.command(site, argv), self.root / f"host-{host}.out")
        self.host_starts[host] = time.time()

    def child_pids(self) -> dict[str, int]:
        """The supervisor's children by name, each its newest pid (``metrics/run.jsonl``)."""
        pids: dict[str, int] = {}
        for record in read_jsonl(self.run_dir / "metrics" / "run.jsonl"):
            if record.get("event") in ("child_started", "child_restarted"):
                pids[record["child"]] = int(record["pid"])
        return pids

    def stop_all(self) -> None:
        """SIGTERM the supervisor (it stops its children) and the hosts; SIGKILL what outlives 20 s."""
        self.done.set()
        for host in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.hosts[host].pid, signal.SIGCONT)
        stop_groups([p for p in [self.supervisor, *self.hosts.values()] if p is not None], 20.0, reap_s=10.0)
        # A supervisor that could not stop its children leaves them in their own sessions.
        for pid in self.child_pids().values():
            with contextlib.suppress(ProcessLookupError, PermissionError, FileNotFoundError):
                if str(self.config_path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                    errors="replace"
                ):
                    os.killpg(pid, signal.SIGKILL)
        self.network.close()

    # -- watching -------------------------------------------------------------------------------
    def sample_rss(self) -> None:
        """Every 2 s: resident memory of the orchestrator, validator and trainer (``/proc``)."""
        while not self.done.wait(2.0):
            for name, pid in self.child_pids().items():
                if name in ("orchestrator", "validator", "trainer"):
                    with contextlib.suppress(OSError, ValueError, StopIteration):  # gone, or a zombie
                        status = Path(f"/proc/{pid}/status").read_text()
                        kb = int(
                            next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]
                        )
                        self.rss.append({"t": time.time(), "process": name, "rss_mb": kb / 1024})

    def keep_hosts_up(self) -> None:
        for host, process in list(self.hosts.items()):
            if process.poll() is not None and not self.done.is_set():
                self.start_host(host)

    def committed_steps(self) -> int:
        return sum(
            1 for r in read_jsonl(self.run_dir / "metrics" / "trainer.jsonl") if r.get("event") == "published"
        )

    def chaos(self) -> None:
        """The seeded kill schedule (module docstring); waits for the first published step."""
        rng = random.Random(self.args.seed)
        relays = [f"shardcast-relay-{i}" for i in range(self.args.relays)]
        validators = ["validator"] + [f"validator-{i}" for i in range(1, self.args.validators)]
        targets = ["orchestrator", *validators, "trainer", "shardcast-origin", *relays]
        targets += [f"host-{h}" for h in range(self.args.hosts)] + ["cut"]
        if self.args.targets:
            targets = self.args.targets.split(",")
        while not self.done.wait(1.0) and self.committed_steps() < 1:
            pass
        order: list[str] = []
        while len(self.kills) < self.args.kills and self.next_kill_due(rng.uniform(0.5, 1.5) * self.args.kill_gap_s):
            if not order:
                order = rng.sample(targets, len(targets))
            target = order.pop()
            if target == "cut":
                host, seconds = rng.randrange(self.args.hosts), rng.uniform(2, 6)
                self.cut(host, seconds)
                self.kills.append(
                    {"t": time.time(), "target": f"link of host-{host}", "seconds": round(seconds, 1)}
                )
            elif target.startswith("host-"):
                host = int(target.split("-")[1])
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.hosts[host].pid, signal.SIGKILL)
                self.kills.append({"t": time.time(), "target": target})
            else:
                pid = self.child_pids().get(target)
                if pid is None:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)  # the role only: the supervisor must notice and restart it
                except ProcessLookupError:  # down already (restarting): the next target
                    continue
                self.kills.append({"t": time.time(), "target": target, "pid": pid})
            print(f"chaos: {self.kills[-1]}", flush=True)

    def next_kill_due(self, gap_s: float) -> bool:
        """Wait ``gap_s`` or until the run has published its share of steps for the next kill, whichever
        comes first (kill ``i`` of ``k`` by step ``1 + i * (steps - 1) // k``, so a fast run cannot end
        before its kills); False once the run is over."""
        due_step = 1 + len(self.kills) * max(0, self.args.steps - 1) // max(1, self.args.kills)
        deadline = time.monotonic() + gap_s
        while time.monotonic() < deadline and self.committed_steps() < due_step:
            if self.done.wait(0.2):
                return False
        return not self.done.is_set()

    def cut(self, host: int, seconds: float) -> None:
        site = host % self.network.sites()
        if self.network.emulated:
            self.network.cut(site, seconds)
            return
        process = self.hosts[host]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGSTOP)
            self.paused.add(host)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)
            self.paused.discard(host)

        threading.Timer(seconds, resume).start()

    def each_orchestrator_thread(self, apply: Callable[[int], None]) -> None:
        """Every 0.2 s, ``apply(tid)`` to each thread of the newest orchestrator process."""
        while not self.done.wait(0.2):
            pid = self.child_pids().get("orchestrator")
            if pid is None:
                continue
            with contextlib.suppress(OSError):  # gone meanwhile (a restart): the next round reaches the new one
                for tid in os.listdir(f"/proc/{pid}/task"):
                    apply(int(tid))

    def pin_orchestrator(self, tid: int) -> None:
        """``--pin-orchestrator``: the orchestrator's thread ``tid`` runs on the machine's last CPU alone
        (the harness, and every process it starts, on the others: ``run``), as an orchestrator on a
        machine of its own would."""
        if os.sched_getaffinity(tid) != {self.core}:
            os.sched_setaffinity(tid, {self.core})

    def prioritize_orchestrator(self, tid: int) -> None:
        """``--orchestrator-nice N``: the orchestrator's thread ``tid`` runs at nice N (below 0: ahead of
        every other process on the machine's shared CPUs), as an operator who co-locates the control
        plane with the swarm would set it."""
        if os.getpriority(os.PRIO_PROCESS, tid) != self.args.orchestrator_nice:
            os.setpriority(os.PRIO_PROCESS, tid, self.args.orchestrator_nice)

    def run(self) -> int:
        """Start everything, wait for the supervisor to end (or ``--timeout-s``); its exit code."""
        assert self.supervisor is None
        if self.args.orchestrator_nice:
            threading.Thread(target=self.each_orchestrator_thread, args=(self.prioritize_orchestrator,), daemon=True).start()
        if self.args.pin_orchestrator:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                raise SystemExit("--pin-orchestrator needs at least 2 CPUs")
            self.core = cpus[-1]
            os.sched_setaffinity(0, set(cpus[:-1]))  # inherited by every process started below
            threading.Thread(target=self.each_orchestrator_thread, args=(self.pin_orchestrator,), daemon=True).start()
        self.start_supervisor()
        for host in range(self.args.hosts):
            self.start_host(host)
        threading.Thread(target=self.sample_rss, daemon=True).start()
        if self.args.kills:
            threading.Thread(target=self.chaos, daemon=True).start()
        deadline = time.monotonic() + self.args.timeout_s
        assert self.supervisor is not None
        while self.supervisor.poll() is None:
            if time.monotonic() > deadline:
                print(f"timed out after {self.args.timeout_s:.0f} s", flush=True)
                return 124
            self.keep_hosts_up()
            time.sleep(0.5)
        return self.supervisor.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=256, help="worker identities")
    parser.add_argument(
        "--hosts", type=int, default=0, help="swarm host processes (0: one per 64 identities, at most 4)"
    )
    parser.add_argument("--relays", type=int, default=2, help="shardcast relays under the origin")
    parser.add_argument(
        "--steps", type=int, default=8, help="trainer steps (the run ends when they are done)"
    )
    parser.add_argument(
        "--hostile-every", type=int, default=10, help="every n-th identity is hostile (0: none)"
    )
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="mean pause after each batch (0: as fast as possible)"
    )
    parser.add_argument(
        "--samples-per-step",
        type=int,
        default=16,
        help="trainer samples per step (size it to the swarm's pace so that answered leases are trained)",
    )
    parser.add_argument("--kills", type=int, default=0, help="SIGKILLs and link cuts during the run")
    parser.add_argument(
        "--validators", type=int, default=1, help="validator.count: validators the run starts (each a chaos target)"
    )
    parser.add_argument("--batches-per-poll", type=int, default=0,
                        help="validator.batches_per_poll: batches a validator takes at a time (0: the default)")  # fmt: skip
    parser.add_argument("--validator-lease-s", type=float, default=0.0,
                        help="orchestrator.validator_lease_s: how long a killed validator's batches stay its own (0: default)")  # fmt: skip
    parser.add_argument(
        "--emulated-prefill-ms-per-token", type=float, default=0.0,
        help="BENCHMARK EMULATION: each validator's prefill takes at least this many ms per token (a sleep; 0: real cost)",
    )  # fmt: skip
    parser.add_argument(
        "--targets", default="", help="comma-separated kill targets (default: every role, host and 'cut')"
    )
    parser.add_argument("--kill-gap-s", type=float, default=8.0, help="mean seconds between two kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--wan",
        action="store_true",
        help="emulated WAN (benchmarks/swarm_wan.py) where namespaces can be made",
    )
    parser.add_argument(
        "--payload-mb", type=float, default=0.0,
        help="policy of at least this many MB in bf16 (a 4-layer Llama built in code, lr 3e-7); 0: the tiny model",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=0.0, help="trainer learning rate (0: the default)")
    parser.add_argument("--host-nice", type=int, default=0,
                        help="run the swarm hosts this much nicer than the control plane (0: the same)")  # fmt: skip
    parser.add_argument("--orchestrator-nice", type=int, default=0,
                        help="run the orchestrator's threads at this nice value (below 0 needs root; 0: as started)")  # fmt: skip
    parser.add_argument("--pin-orchestrator", action="store_true",
                        help="the orchestrator alone on the last CPU, everything else on the others (a "
                             "machine of its own)")  # fmt: skip
    parser.add_argument("--trusted-listener", action="store_true",
                        help="orchestrator.trusted_port: the validator and trainer on a listener of their own "
                             "(its own thread and event loop; default: they share the workers' port)")  # fmt: skip
    parser.add_argument("--delta", action=argparse.BooleanOptionalAction, default=True,
                        help="[shardcast] delta: publish versions also as deltas against the previous one")  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=900.0, help="stop and fail after this long")
    parser.add_argument("--lease-judgeable", action=argparse.BooleanOptionalAction, default=None,
                        help="orchestrator.lease_judgeable: lease only what can be judged in time (default: the config's)")  # fmt: skip
    parser.add_argument(
        "--root", default="", help="working folder (default: a new temporary one, kept for inspection)"
    )
    parser.add_argument("--record", action=argparse.BooleanOptionalAction, default=None,
                        help="write benchmarks/results/swarm.{json,md} (default: when --root is not given)")  # fmt: skip
    args = parser.parse_args(argv)
    args.hosts = args.hosts or min(4, max(1, args.identities // 64))
    record = args.record if args.record is not None else not args.root
    root = Path(args.root or tempfile.mkdtemp(prefix="swarm-"))
    root.mkdir(parents=True, exist_ok=True)
    network = open_network(args.hosts, args.seed, emulate=args.wan)
    print(
        f"swarm: {args.identities} identities on {args.hosts} hosts, network: {network.description}, root {root}",
        flush=True,
    )
    swarm = Swarm(root, write_config(root, args, network), args, network)
    atexit.register(swarm.stop_all)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: sys.exit(128 + signum))
    started, load_start = time.time(), os.getloadavg()[0]
    code = swarm.run()
    ended_at, load_end = time.time(), os.getloadavg()[0]
    swarm.stop_all()
    records = RunRecords.read(root)
    violations = check_invariants(swarm.config, records, swarm.host_starts, ended_at)
    figures = compute_figures(swarm.config, records, swarm.rss, swarm.kills, args=vars(args), network=network.description,
                              emulated=network.emulated, seconds=time.time() - started, run_code=code, violations=violations,
                              load_average=(round(load_start, 2), round(load_end, 2)))  # fmt: skip
    figures["validators"] = validator_figures(swarm.config, records, swarm.kills)
    (root / "figures.json").write_text(json.dumps(figures, indent=1))
    (root / "rss.json").write_text(json.dumps(swarm.rss))  # every 2 s, per process: windows of a long run
    if record:
        record_results(figures)
    for name, ids in violations.items():
        print(
            f"{'OK  ' if not ids else 'FAIL'} {name}" + (f": {', '.join(map(str, ids[:20]))}" if ids else "")
        )
    print(json.dumps(figures["summary"], indent=1))
    print("validators:", json.dumps(figures["validators"], indent=1))
    failed = code != 0 or any(violations.values())
    print(f"swarm: {'FAILED' if failed else 'ok'} (run exit code {code}); details in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
