"""``toploc`` command line: ``toploc bench`` and ``toploc inspect PROOF``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toploc.errors import ProofFormatError
from toploc.wire import ProofPoly, strict_b64decode


def _load(proof: str) -> bytes:
    """PROOF is a file path (raw bytes, or base64 text), a hex string, or a base64 string.

    Raises:
        FileNotFoundError: PROOF names no file, is neither hex nor base64, and looks like a
            path (has a ``.``, ``/``, ``\\`` or ``~``).
        ProofFormatError: PROOF is none of the three.
    """
    try:
        is_file = Path(proof).is_file()
    except OSError:  # e.g. a 516-character hex proof is too long to be a file name
        is_file = False
    if is_file:
        path = Path(proof)
        data = path.read_bytes()
        try:
            return strict_b64decode(data.strip())
        except ProofFormatError:
            return data
    try:
        return bytes.fromhex(proof)
    except ValueError:
        pass
    try:
        return strict_b64decode(proof)
    except ProofFormatError as exc:
        if any(mark in proof for mark in "./\\~"):
            raise FileNotFoundError(f"no such file: {proof}") from None
        raise ProofFormatError(f"not a file, a hex string or base64 ({exc})") from None


def inspect(proof: str, topk: int) -> str:
    """Human-readable summary of one or more concatenated proofs of ``2 + 2·topk`` bytes."""
    data = _load(proof)
    size = 2 + 2 * topk
    if len(data) == 0 or len(data) % size:
        raise ProofFormatError(f"{len(data)} bytes is not a multiple of {size} (topk={topk})")
    lines = [f"{len(data)} bytes = {len(data) // size} proof(s) of {size} bytes (topk={topk})"]
    for i in range(0, len(data), size):
        poly = ProofPoly.from_bytes(data[i : i + size], topk=topk)
        head = " ".join(str(c) for c in poly.coeffs[:6])
        lines.append(
            f"proof {i // size}: modulus {poly.modulus}, coefficients c0..c5 = {head} ... c{topk - 1} = {poly.coeffs[-1]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toploc", description="TOPLOC proofs of honest inference")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="CPU benchmark (see toploc.bench)", add_help=False)
    show = sub.add_parser("inspect", help="decode and print a proof")
    show.add_argument("proof", help="a file (raw or base64), a hex string or a base64 string")
    show.add_argument("--topk", type=int, default=128)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from toploc.bench import main as bench_main

        bench_main(rest)
        return 0
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    try:
        print(inspect(args.proof, args.topk))
    except ProofFormatError as exc:
        print(f"toploc inspect: invalid proof: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a missing or unreadable file
        print(f"toploc inspect: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
