"""Greedy speculative decoding equals plain decoding token for token, on the build and CPU this runs on:
`make test-aarch64` runs it under qemu-aarch64 on tiny models (tests/tiny_models.py) written by the host.

    python -m tests.aarch64.greedy_equal TARGET DRAFT --verified N [--tokens 96]

Three ways against plain one-token decoding (`--no-draft`), each from the same prompts:
  - the defaults: the draft model and n-gram lookup routed by the cost model (specchat's AutoPlanner,
    seeded), with the tie margin and trusted verify width calibrated on this target as `specchat run`
    does (`--verified`: the rows the build's invariance probe showed bit-exact);
  - every verify row trusted: the draft model forced to k = 4, 16 and 48 tokens a round (no confidence
    cut-off) with no tie margin, so every token comes from a row of a batch of 5, 17 or 49 rows (fewer
    only at the token limit) -- equal output needs those rows to round like one-token decoding (the
    probe's claim, on this model).
Prints one line per way and `greedy: N passed, N failed`; exit status 1 when any output differs.
Runs the loop and engine of specchat itself; imports nothing but them, numpy and llama_cpp.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = (
    "def fibonacci(n):\n    ",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n",
)
FORCED_K = (4, 16, 48)


@dataclass
class _Loaded:
    """What decoding.planner.make_planner reads of models.loader.Loaded (that module's Hub side is not
    needed here, and the target is loaded the same way)."""

    target: object
    drafters: list[object] = field(default_factory=list)
    backend: str = ""
    verified_rows: int = 0
    strict: bool = False


def _tokens(events: object) -> list[int]:
    from specchat.decoding.events import Token

    return [e.id for e in events if isinstance(e, Token)]  # type: ignore[attr-defined]


def run(target_path: Path, draft_path: Path, *, verified: int, max_tokens: int) -> list[tuple[str, bool]]:
    """(way, equal to plain decoding on every prompt) for the defaults and each forced k."""
    from specchat.decoding import registry
    from specchat.decoding.calibration import exact_rows, tie_margin
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.loop import FixedK, Settings, generate
    from specchat.decoding.planner import make_planner
    from specchat.llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions

    # as models.loader.load loads a CPU target: V in f16 where the probe showed the build exact
    target_opts = LoadOptions(
        n_ctx=512, gpu_layers=0, repack=True, type_v=None if verified else GGML_TYPE_BF16
    )
    results: list[tuple[str, bool]] = []
    with (
        LlamaModel(target_path, target_opts, name="target") as target,
        LlamaModel(draft_path, LoadOptions(n_ctx=512, gpu_layers=0), name="draft") as draft,
    ):
        prompts = [target.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS]
        plain = []
        for prompt in prompts:
            target.truncate(0)
            plain.append(_tokens(generate(target, prompt, settings=Settings(max_tokens=max_tokens))))
        backend = "aarch64-emulated"
        loaded = _Loaded(
            target, [ModelDrafter(draft, p_min=0.75), registry.make(registry.NGRAM)], backend, verified
        )
        margin = tie_margin(target, backend=backend)
        rows = exact_rows(target, backend=backend, verified=verified)
        ways: list[tuple[str, object, Settings, Sequence[object]]] = [
            (
                "defaults (draft model + ngram, auto)",
                make_planner(loaded, None, seed=0),
                Settings(max_tokens=max_tokens, tie_margin=margin, exact_rows=rows),
                loaded.drafters,
            ),
        ]
        eager = [ModelDrafter(draft, p_min=0.0)]  # no confidence cut-off: k drafts, k + 1 rows, every round
        for k in FORCED_K:
            settings = Settings(max_tokens=max_tokens, tie_margin=0.0, exact_rows=verified)
            ways.append((f"draft model, k={k}, every row trusted", FixedK(k), settings, eager))
        for name, planner, settings, drafters in ways:
            equal = True
            for prompt, want in zip(prompts, plain, strict=True):
                target.truncate(0)
                for d in drafters:
                    d.reset()  # type: ignore[attr-defined]
                got = _tokens(generate(target, prompt, drafters=drafters, planner=planner, settings=settings))  # type: ignore[arg-type]
                equal = equal and got == want
            results.append(
                (f"{name}: margin {settings.tie_margin:.3g}, exact rows {settings.exact_rows}", equal)
            )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument(
        "--verified", type=int, default=0, help="rows the build's invariance probe showed exact"
    )
    parser.add_argument("--tokens", type=int, default=96, help="tokens generated per prompt")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specchat-greedy-") as home:
        os.environ["SPECCHAT_HOME"] = home  # calibration caches of this run only
        results = run(args.target, args.draft, verified=args.verified, max_tokens=args.tokens)
    for name, equal in results:
        print(f"{'equal' if equal else 'DIFFERS'}: {name}")
    failed = sum(not ok for _, ok in results)
    print(f"greedy: {len(results) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
