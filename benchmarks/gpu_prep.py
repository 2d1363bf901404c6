"""Prepare the GPU check for a machine that has torch but not our other dependencies, offline.

    python benchmarks/gpu_prep.py            # download the wheels into .whl/, check sizes, print the command
    python benchmarks/gpu_prep.py --check    # only check what is there

A GPU machine lent for a few minutes has Python 3.12, torch, transformers, numpy, safetensors and
sympy, but not pydantic (which ``prime_rl`` imports) or zstandard (``shardcast``'s codec), and it
reaches no package index. This downloads exactly those wheels (cp312, manylinux x86_64, no
dependencies pulled in implicitly: each one is named) into ``.whl/`` (git-ignored), checks that
the working tree plus the wheels stay under the 64 MiB that travels with a call, and prints the
one command to run there: install the wheels into ``/tmp/site``, put the five packages' sources on
``PYTHONPATH`` and run ``benchmarks/gpu_check.py``, teeing its log and JSON into ``$OUT``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
LIMIT = 64 << 20  # bytes of working tree (tracked + untracked, not ignored) and carried paths per call

# pydantic and what it needs (typing-extensions: the machine's may be older than pydantic asks),
# zstandard for shardcast's codec. Versions pinned together: pydantic pins its core exactly.
REQUIREMENTS = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "zstandard==0.25.0",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
PACKAGES = ("toploc", "shardcast", "grpo", "verifiers", "prime_rl")

# Run from the repository root (the package paths are relative): the check, then every cuda-marked test.
COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
    ".whl/*.whl && export PYTHONPATH=/tmp/site:{paths} PYTHONUNBUFFERED=1 TORCH_LOGS=recompiles,graph_breaks GPU_CHECK_COMMIT={commit} || exit; "
    "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; timeout {budget} python3 "
    "benchmarks/gpu_check.py --out $OUT/gpu_check.json > $OUT/gpu_check.log 2>&1; echo gpu_check rc=$?; "
    "grep -v '^V1' $OUT/gpu_check.log | tail -60; timeout {test_budget} python3 -m pytest -q -m cuda "
    "-p no:cacheprovider > $OUT/cuda_tests.log 2>&1; echo pytest rc=$?; tail -30 $OUT/cuda_tests.log"
)


def download() -> None:
    WHEELS.mkdir(exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS), *REQUIREMENTS],
        check=True,
    )  # fmt: skip
    wanted = {r.split("==")[0].replace("-", "_").lower() for r in REQUIREMENTS}
    for wheel in WHEELS.glob("*.whl"):  # a wheel left from another version would install twice
        name, version = wheel.name.split("-")[:2]
        if f"{name.lower()}=={version}" not in {r.replace("-", "_").lower() for r in REQUIREMENTS}:
            print(f"removing {wheel.name}: not in the pinned list")
            wheel.unlink()
    missing = wanted - {w.name.split("-")[0].lower() for w in WHEELS.glob("*.whl")}
    if missing:
        raise SystemExit(f"no wheel for {sorted(missing)}")


def travelling_bytes() -> int:
    """Tracked and untracked-not-ignored files, plus the wheels."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    files = [ROOT / name.decode() for name in listed if name]
    wheels = list(WHEELS.glob("*.whl"))
    return sum(f.stat().st_size for f in files + wheels if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="download nothing: check what is there")
    parser.add_argument("--budget", type=int, default=420, help="seconds the check may run there")
    parser.add_argument("--test-budget", type=int, default=120, help="seconds the cuda-marked tests may run there")
    args = parser.parse_args(argv)
    if not args.check:
        download()
    size = travelling_bytes()
    print(f"working tree + wheels: {size / 2**20:.1f} MiB of {LIMIT >> 20} MiB")
    if size > LIMIT:
        print("too large to travel: ignore or remove what the check does not need")
        return 1
    paths = ":".join(f"$PWD/packages/{p}/src" for p in PACKAGES)
    print("carry: [\".whl\"]")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip() or "unknown"
    command = COMMAND.format(paths=paths, budget=args.budget, test_budget=args.test_budget, commit=commit)
    if len(command) > 2000:  # the device tool takes commands of at most 2,000 characters
        print(f"the command is {len(command)} characters: over 2,000")
        return 1
    print(f"timeout_s: {args.budget + args.test_budget + 40}")
    print("command:", command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
