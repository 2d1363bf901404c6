"""Every measured figure in the user-facing docs has a committed results file behind it.

A figure is a number with a unit of time, speed, size or ratio (``660 s``, ``1.04x``, ``25.0 GiB``,
``12,115 tok/s``, ``19%``), outside code blocks and inline code. Numbers without a unit (table
cells under a unit heading, counts) are not checked. Each heading's section that states one must cite
at least one file under ``benchmarks/results/`` that exists, and the figure's number must appear in
one of the section's cited files, as printed or without its thousands commas. A number that is
not a measurement (a default, a limit, a hardware requirement, a figure from another project) is
listed in the section's marker, with the reason::

    <!-- not measured (defaults of [orchestrator]): 300 s, 30 s -->

and a marker must not list a figure its section no longer states. The check is textual: it
proves that a results file holds the number, not that the number is the one the sentence means.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [
    ROOT / "README.md",
    ROOT / "examples" / "README.md",
    *sorted(ROOT.glob("packages/*/README.md")),
    ROOT / "packages" / "prime_rl" / "API.md",
    ROOT / "docs" / "byo.md",
]

UNITS = (
    r"ms|µs|us|s|min|minutes|seconds|hours|h|x|×|%|GiB|GB|MiB|MB|KiB|KB|kB|"
    r"tok/s|tokens/s|samples/s|steps/s|leases/s|Mb/s|Mbit/s|Gb/s|Gbit/s|MB/s|GB/s"
)
FIGURE = re.compile(r"(?<![\w./])(\d[\d,]*(?:\.\d+)?)\s?(" + UNITS + r")(?![\w/])")
CITED = re.compile(r"results/([\w./-]*\w)")
MARKER = re.compile(r"<!--\s*not measured\s*\(([^)]*)\)\s*:(.*?)-->", re.S)
FENCE = re.compile(r"```.*?```", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def sections(path: Path) -> list[tuple[str, str]]:
    """``(heading, body)`` per heading of ``path``, code blocks removed."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    parts = re.split(r"\n(?=#{1,6} )", "\n" + text)
    return [(part.strip().splitlines()[0] if part.strip() else "", part) for part in parts]


def figures(body: str) -> list[str]:
    """The figures of a section's prose (markers, other comments and inline code excluded), as printed."""
    prose = INLINE_CODE.sub("", COMMENT.sub("", body))
    return [f"{number} {unit}" for number, unit in FIGURE.findall(prose)]


def exempt(body: str) -> tuple[set[str], list[str]]:
    """The figures the section's markers list, and the markers that give no reason."""
    listed: set[str] = set()
    unexplained = []
    for reason, items in MARKER.findall(body):
        if not reason.strip():
            unexplained.append(items.strip())
        for item in items.split(","):
            if match := FIGURE.search(item.strip()):
                listed.add(f"{match.group(1)} {match.group(2)}")
    return listed, unexplained


def problems(path: Path) -> list[str]:
    found = []
    for heading, body in sections(path):
        stated = figures(body)
        listed, unexplained = exempt(body)
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name} :: {heading[:70]}"
        found += [f"{where}: a marker without a reason ({items})" for items in unexplained]
        found += [f"{where}: the marker lists {f!r}, which the section does not state" for f in listed - set(stated)]
        unlisted = [f for f in stated if f not in listed]
        if not unlisted:
            continue
        cited = [RESULTS / name for name in CITED.findall(COMMENT.sub("", body))]
        found += [f"{where}: cites {p.relative_to(ROOT)}, which does not exist" for p in cited if not p.exists()]
        held = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in cited if p.is_file())
        if not held:
            found.append(f"{where}: states {unlisted} and cites no results file")
            continue
        for figure in unlisted:
            number = figure.split(" ")[0]
            if number not in held and number.replace(",", "") not in held:
                found.append(f"{where}: {figure!r} is in none of {[p.name for p in cited]}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_has_a_results_file(path: Path) -> None:
    assert path.is_file()
    found = problems(path)
    assert not found, "\n".join(found)


def test_the_check_catches_what_it_should(tmp_path: Path) -> None:
    # A figure without a file, a figure its cited file lacks, a stale marker and a marker without
    # a reason each fail; a figure the file holds and a listed default pass.
    (RESULTS / "gpu_check.md").is_file() or pytest.skip("needs benchmarks/results/gpu_check.md")
    doc = tmp_path / "README.md"
    doc.write_text(
        "# a\nThe step took 274 ms (`benchmarks/results/gpu_check.md`).\n\n"
        "# b\nIt took 12.5 s.\n\n"
        "# c\nIt took 9,999,999 ms (`benchmarks/results/gpu_check.md`).\n\n"
        "# d\nThe timeout is 300 s.\n<!-- not measured (a default): 300 s, 30 s -->\n\n"
        "# e\nThe limit is 64 MiB.\n<!-- not measured (): 64 MiB -->\n"
    )
    found = [line.split(" :: ")[1] for line in problems(doc)]
    assert [f.split(":")[0] for f in found] == ["# b", "# c", "# d", "# e"], found
    assert "cites no results file" in found[0] and "9,999,999 ms" in found[1]
    assert "'30 s'" in found[2] and "without a reason" in found[3]
