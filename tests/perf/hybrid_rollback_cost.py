"""What a rejected draft costs a hybrid target and its draft model, per context length.

Not a test (pytest does not collect it). For each file of a pair from tests/perf/hybrid_models.py and
each context length, in interleaved passes (every measurement once, then again ...), keeping each
one's fastest time (a busy machine slows some passes, never speeds one up):

* `V(n)`: a verify batch of n rows (n = 1, 5, 9, 17), the cache then taken back to where it started;
* `snapshot back`: a 5-row batch cut back 4 tokens by llama.cpp's snapshots (free: the time of the
  batch alone), then the next one-row decode;
* `checkpoint back`: a 9-row batch cut back 7 tokens (past the snapshots: restore the checkpoint taken
  before it), then the next one-row decode, which replays the 2 tokens kept in front of it;
* `save` / `restore`: one copy of the recurrent state out and back (llama_state_seq_*_ext, partial);
* on the draft model (snapshots 0, as specchat loads it): a round of 4 one-token drafts, 2 accepted,
  then the catch-up decode of 2 tokens, with the state after each step kept (`steps`, what
  specchat does where a copy is cheap) and without (`checkpoint + replay`).

Usage:
  python tests/perf/hybrid_rollback_cost.py --pair qwen35 [--pair lfm2] [--context 130,2000] [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specchat.llama.engine import LlamaModel, LoadOptions  # noqa: E402
from specchat.llama.rollback import TARGET_SNAPSHOTS  # noqa: E402
from tests.perf.hybrid_vs_llama import MODELS, PAIRS, prompt_text  # noqa: E402


def _timed(fn: Callable[[], None], undo: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    took = time.perf_counter() - t
    undo()
    return took


def target_cases(m: LlamaModel, base: int, nxt: list[int]) -> dict[str, tuple[Callable, Callable]]:
    def back() -> None:
        m.truncate(base)

    def batch(n: int) -> Callable[[], None]:
        return lambda: m.decode(nxt[:n], list(range(n)))

    def snapshot_back() -> None:
        m.decode(nxt[:5], list(range(5)))
        m.truncate(base + 1)
        m.decode([nxt[1]], [0])

    def checkpoint_back() -> None:
        m.decode(nxt[:9], list(range(9)))
        m.truncate(base + 2)
        m.decode([nxt[2]], [0])

    rb = m._rollback  # the engine's own copy calls, timed alone
    assert rb is not None
    ckpt = rb.save(base)
    cases: dict[str, tuple[Callable, Callable]] = {f"V({n})": (batch(n), back) for n in (1, 5, 9, 17)}
    cases["snapshot back 4 + 1 row"] = (snapshot_back, back)
    cases["checkpoint back 7 + 1 row (+2 replayed)"] = (checkpoint_back, back)
    cases["save"] = (lambda: rb.save(base), lambda: None)
    cases["restore"] = (lambda: rb.restore(ckpt), lambda: None)
    return cases


def draft_cases(m: LlamaModel, base: int, nxt: list[int]) -> dict[str, tuple[Callable, Callable]]:
    def round_(steps: bool) -> Callable[[], None]:
        def run() -> None:
            m.checkpoint()
            if m._rollback is not None:  # recurrent: keep the step states or not
                m._rollback.stepping = steps and m._rollback.cheap_steps
            for t in nxt[:4]:
                m.decode([t], [0])
            m.truncate(base + 2)
            m.decode(nxt[2:4], [1])  # the catch-up: the correction and the next token

        return run

    def back() -> None:
        m.truncate(base)

    return {"round, steps kept": (round_(True), back), "round, checkpoint + replay": (round_(False), back)}


def measure(path: Path, contexts: list[int], reps: int, *, draft: bool) -> None:
    opts = LoadOptions(n_ctx=4096, threads=2, snapshots=0 if draft else TARGET_SNAPSHOTS)
    with LlamaModel(path, opts) as m:
        text = m.tokenize(prompt_text(max(contexts) + 200))
        for n_ctx in contexts:
            m.truncate(0)
            m.decode(text[:n_ctx], [])
            nxt = text[n_ctx : n_ctx + 32]
            cases = (draft_cases if draft else target_cases)(m, n_ctx, nxt)
            best: dict[str, float] = {}
            for r in range(reps):
                for name in cases if r % 2 == 0 else reversed(list(cases)):
                    fn, undo = cases[name]
                    best[name] = min(best.get(name, float("inf")), _timed(fn, undo))
            cheap = m._rollback.cheap_steps if m._rollback is not None else None
            print(f"{path.name} at {n_ctx} tokens (steps kept: {cheap}):")
            for name, s in best.items():
                print(f"  {name:42s} {s * 1000:8.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", action="append", choices=["qwen35", "lfm2"], required=True)
    ap.add_argument("--context", default="130,2000")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    contexts = [int(x) for x in args.context.split(",")]
    for name in args.pair:
        measure(MODELS / PAIRS[name]["target"], contexts, args.reps, draft=False)
        measure(MODELS / PAIRS[name]["draft"], contexts, args.reps, draft=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
