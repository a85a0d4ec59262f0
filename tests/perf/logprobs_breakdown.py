"""Where logprobs' time goes, per token, in `serve`'s own stack: a load-tolerant companion to
logprobs_cost.py.

Not a test (pytest does not collect it). In one process, as `specchat serve` runs (models loaded and
generating on this thread, HTTP in another), it sends greedy requests with `logprobs: true,
top_logprobs: N` and times the two steps logprobs add, each call wrapped: the loop's
`token_logprob` (the target row's log_softmax and top N) and the worker's `logprob_entry` (ids to
bytes). Their sum per token, against the loop's decode time per token in the same requests, is the
share of a token's time logprobs cost. Both are wall-clock times in the same seconds, so other load
on the machine stretches them alike, which a tok/s comparison between two requests cannot assume.

Usage: python tests/perf/logprobs_breakdown.py TARGET DRAFT [PROMPT] [--tokens N] [--requests R]
       [--top N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specchat.decoding import loop
from specchat.models import loader
from specchat.server import worker as worker_module
from tests.serving import serve_here

DEFAULT_PROMPT = (
    "Write a Python function that parses an ISO 8601 date string into a datetime, with a docstring."
)


def timed(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--top", type=int, default=5)
    opts = ap.parse_args()
    rows: list[float] = []
    entries: list[float] = []
    loop.token_logprob = timed(loop.token_logprob, rows)  # type: ignore[assignment]
    worker_module.logprob_entry = timed(worker_module.logprob_entry, entries)  # type: ignore[assignment]
    cfg = loader.LoadConfig(target=opts.target, drafts=(opts.draft, "ngram"), ctx_size=4096)
    loaded = loader.load(cfg)
    body = {
        "model": "x",
        "temperature": 0,
        "max_tokens": opts.tokens,
        "messages": [{"role": "user", "content": opts.prompt}],
        "logprobs": True,
        "top_logprobs": opts.top,
    }

    def drive(url: str) -> list[tuple[int, float, float, float]]:
        out = []
        for i in range(opts.requests + 1):  # the first warms up: prefill, the planner's first rounds
            rows.clear()
            entries.clear()
            spec = httpx.post(f"{url}/chat/completions", json=body, timeout=900).json()["speculative"]
            if i:
                out.append((spec["generated_tokens"], spec["decode_seconds"], sum(rows), sum(entries)))
                print(
                    f"request {i}: {spec['generated_tokens']} tokens, {spec['tokens_per_second']:.2f} tok/s, "
                    f"token_logprob {1e3 * sum(rows) / len(rows):.3f} ms/token, "
                    f"logprob_entry {1e3 * sum(entries) / len(entries):.3f} ms/token",
                    flush=True,
                )
        return out

    try:
        got = serve_here(loader.LoadedEngine(loaded), drive)
    finally:
        loaded.close()
    shares = [(lp + en) / (decode - lp - en) for _, decode, lp, en in got]
    per_token = [1e3 * (lp + en) / n for n, _, lp, en in got]
    decode_ms = [1e3 * (decode - lp - en) / n for n, decode, lp, en in got]
    lp_ms, plain_ms, share = (statistics.median(v) for v in (per_token, decode_ms, shares))
    print(
        f"\nmedians of {len(got)} requests, top_logprobs {opts.top}: logprobs {lp_ms:.3f} ms/token "
        f"against {plain_ms:.2f} ms/token of decoding without them: +{100 * share:.2f}%"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
