"""Prompt processing speed: specchat's target (loaded as `run`/`serve` load it) against llama.cpp's
own llama-bench on the same file, interleaved, as a ratio.

Not a test (pytest does not collect it): the measurement behind the prefill figure in
docs/performance.md. Each round times specchat decoding N tokens into an empty cache (no logits, as
generate's prefill does, in n_batch chunks) and runs `llama-bench -p N -n 0 -fa 1` (its default
cache types, threads and batch sizes), one right after the other and in turn first (a VM that speeds
up or slows down within a round favours neither side over the rounds); the ratio reported is the
median of the rounds' own ratios, each taken from two runs a few seconds apart.

Usage: python tests/perf/prefill.py TARGET LLAMA_BENCH [--sizes 512,2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import numpy as np

from specchat.models.loader import LoadConfig, load


def specchat_prefill(model, n: int, seed: int) -> float:  # type: ignore[no-untyped-def]
    """Tokens a second for a prompt of `n` random tokens into an empty cache."""
    tokens = [int(t) for t in np.random.default_rng(seed).integers(100, 30000, n)]
    model.truncate(0)
    t0 = time.perf_counter()
    model.decode(tokens, [])
    return n / (time.perf_counter() - t0)


def llama_bench(binary: str, target: str, n: int) -> float:
    out = subprocess.run(
        [binary, "-m", target, "-p", str(n), "-n", "0", "-fa", "1", "-r", "1", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out)[0]["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("llama_bench")
    ap.add_argument("--sizes", default="512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    loaded = load(LoadConfig(args.target, ctx_size=max(sizes) + 64))
    model = loaded.target
    print(
        f"specchat target: V type {'f16' if model.type_v is None else model.type_v}, {model.threads} threads"
    )
    specchat_prefill(model, 64, 0)  # warm-up, as llama-bench does
    ours: dict[int, list[float]] = {n: [] for n in sizes}
    theirs: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(args.rounds):
        for n in sizes:
            if r % 2 == 0:
                ours[n].append(specchat_prefill(model, n, r))
                theirs[n].append(llama_bench(args.llama_bench, args.target, n))
            else:
                theirs[n].append(llama_bench(args.llama_bench, args.target, n))
                ours[n].append(specchat_prefill(model, n, r))
            a, b = ours[n][-1], theirs[n][-1]
            print(f"round {r + 1} pp{n}: specchat {a:.1f} tok/s, llama-bench {b:.1f} tok/s ({a / b:.2f}x)")
    loaded.close()
    for n in sizes:
        a, b = statistics.median(ours[n]), statistics.median(theirs[n])
        ratio = statistics.median(x / y for x, y in zip(ours[n], theirs[n], strict=True))
        print(
            f"pp{n}: specchat {a:.1f}, llama-bench {b:.1f} tok/s (medians); "
            f"median of the rounds' ratios {ratio:.2f}x ({args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
