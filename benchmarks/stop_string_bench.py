"""Benchmark: the stop-string check over one completion, the old rule vs ``StopStringMatcher``.

The old rule (:func:`old_rule`, kept here as the naive reference only) decoded the whole completion
after every token: O(n) per token, O(n^2) per completion. ``StopStringMatcher`` decodes the tokens
since the last whole character after a short window (``prime_rl.inference.stop_strings``). Both
run on the same token ids, one completion at a time, and must stop at the same token.

Tokenizer: a byte-level BPE (Qwen2's decoder) of 2,048 ids trained in code on random sentences of
common English words plus ``café``, ``naïve``, ``€5``, ``中文``, ``😀``, ``x²`` (4.7 characters
a token). A completion of ``n`` tokens is such text with the stop string ``</answer>`` as its last
tokens, so both rules scan all ``n`` tokens and stop at the last one. Old-rule repeats are fewer
at 16k tokens (``--old-repeats``); a run past ``--cap`` seconds stops and is reported as cut, never
extrapolated.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/stop_string_bench.py [--sizes 1024 4096
16384] [--repeats 5] [--old-repeats 5 3 1] [--cap 900]``; writes
``benchmarks/results/stop_string_bench.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import random
import statistics
import textwrap
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from prime_rl.inference.contract import completion_text
from prime_rl.inference.stop_strings import StopStringMatcher

RESULTS = Path(__file__).resolve().parent / "results"
STOP = ("</answer>",)
COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there been one all we their has would when if so no will what out up more "
    "said about some into them can only other time new could these two may first then do any like my "
    "now over such our man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take three"
)
WORDS = [*COMMON_WORDS.split(" "), "café", "naïve", "€5", "中文", "😀", "x²"]


def sentences(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE of 2,048 ids trained on 2,000 random 50-word sentences (~0.2 s)."""
    rng = random.Random(seed)
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    core.train_from_iterator([sentences(rng, 50) for _ in range(2000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")


def completion(tokenizer: Any, n: int, seed: int = 1) -> list[int]:
    """``n`` token ids of random sentences whose last tokens spell the stop string."""
    ending = tokenizer.encode(" " + STOP[0])
    body = tokenizer.encode(sentences(random.Random(seed), n))  # > 1 token a word: enough text
    return body[: n - len(ending)] + ending


def old_rule(tokenizer: Any, tokens: list[int], deadline: float) -> tuple[int | None, int]:
    """The naive reference: decode the whole completion after every token. Returns the stopping
    index (None: no stop) and how many tokens were checked before ``deadline`` (``time.perf_counter``)."""
    for end in range(1, len(tokens) + 1):
        text = completion_text(tokenizer, tokens[:end])
        if any(s in text for s in STOP):
            return end - 1, end
        if time.perf_counter() > deadline:
            return None, end
    return None, len(tokens)


def new_rule(tokenizer: Any, tokens: list[int]) -> int | None:
    matcher = StopStringMatcher(tokenizer, STOP)
    for index, token in enumerate(tokens):
        if matcher.append(token):
            return index
    return None


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        model = platform.processor()
    versions = {name: importlib.metadata.version(name) for name in ("transformers", "tokenizers")}
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        "load_average_start": os.getloadavg(),
    }


def render(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    header = f"{'tokens':>6} {'rule':<24} {'runs':>4} {'min s':>9} {'median s':>9} {'us/token':>9} {'old/new':>8}"
    lines = [header, "-" * len(header)]
    for row in rows:
        new = next(r for r in rows if r["tokens"] == row["tokens"] and r["rule"] == "StopStringMatcher")
        if row["finished"]:
            per_token = f"{1e6 * row['median_s'] / row['tokens']:>9.1f}"
            ratio = f"{row['median_s'] / new['median_s']:>8.1f}"
            cut = ""
        else:
            per_token, ratio = f"{'-':>9}", f"{'-':>8}"
            cut = f"  (cut at {row['checked']} of {row['tokens']} tokens)"
        lines.append(
            f"{row['tokens']:>6} {row['rule']:<24} {row['runs']:>4} {row['min_s']:>9.4f} {row['median_s']:>9.4f}"
            f" {per_token} {ratio}{cut}"
        )
    prose = (
        f"{info['cpu']}, {info['cores']} cores shared with other sessions (load average "
        f"{info['load_average_start'][0]:.1f} at the start, {info['load_average_end'][0]:.1f} at the end), "
        f"Python {info['python']}, transformers {info['transformers']}, tokenizers {info['tokenizers']}, "
        "OMP_WAIT_POLICY=PASSIVE. One completion at a time: a byte-level BPE of 2,048 ids trained in code "
        "(4.7 characters a token, multi-byte characters included), the stop string `</answer>` as its "
        "last tokens, so both rules check every token and stop at the last one (asserted equal). "
        "Old rule: the whole completion decoded after every token (the naive reference in the "
        f"script); cap {info['cap_s']:g} s a run, never extrapolated. us/token and old/new: from the "
        "medians. Raw rows: `stop_string_bench.json`."
    )
    return (
        f"# stop_string_bench.py: the stop-string check over one completion ({info['date']}, CPU)\n\n"
        + textwrap.fill(prose, width=100)
        + f"\n\n`stop_string_bench.py {info['argv']}`\n\n```\n"
        + "\n".join(lines)
        + "\n```\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=5, help="runs of StopStringMatcher per size")
    parser.add_argument("--old-repeats", type=int, nargs="+", default=[5, 3, 1], help="old-rule runs per size")
    parser.add_argument("--cap", type=float, default=900.0, help="seconds one old-rule run may take")
    args = parser.parse_args()
    if len(args.old_repeats) != len(args.sizes):
        parser.error("--old-repeats needs one count per size")
    info = machine()
    tokenizer = build_tokenizer()
    rows: list[dict[str, Any]] = []
    for n, old_runs in zip(args.sizes, args.old_repeats, strict=True):
        tokens = completion(tokenizer, n)
        times: dict[str, list[float]] = {"StopStringMatcher": [], "old rule (whole decode)": []}
        checked, finished = n, True
        for run in range(max(args.repeats, old_runs)):
            if run < args.repeats:
                start = time.perf_counter()
                index = new_rule(tokenizer, tokens)
                times["StopStringMatcher"].append(time.perf_counter() - start)
                assert index == n - 1, f"the matcher stopped at {index}, not at the last token {n - 1}"
            if run < old_runs:
                start = time.perf_counter()
                old_index, checked = old_rule(tokenizer, tokens, start + args.cap)
                times["old rule (whole decode)"].append(time.perf_counter() - start)
                finished = finished and old_index is not None
                assert old_index in (n - 1, None), f"the old rule stopped at {old_index}"
        for rule, seconds in times.items():
            row = {"tokens": n, "rule": rule, "runs": len(seconds), "min_s": min(seconds),
                   "median_s": statistics.median(seconds), "seconds": seconds,
                   "finished": finished or rule == "StopStringMatcher",
                   "checked": n if rule == "StopStringMatcher" else checked}  # fmt: skip
            rows.append(row)
            print(f"{n:>6} {rule:<24} min {row['min_s']:.4f} s median {row['median_s']:.4f} s", flush=True)
    info |= {
        "load_average_end": os.getloadavg(),
        "date": datetime.date.today().isoformat(),
        "cap_s": args.cap,
        "argv": f"--sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats} "
        f"--old-repeats {' '.join(map(str, args.old_repeats))} --cap {args.cap:g}",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stop_string_bench.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1) + "\n")
    (RESULTS / "stop_string_bench.md").write_text(render(rows, info))
    print(f"wrote {RESULTS / 'stop_string_bench.md'}")


if __name__ == "__main__":
    main()
