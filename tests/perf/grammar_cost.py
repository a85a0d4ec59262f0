"""What a grammar check costs on a real vocabulary (llama/grammar.py), per call size and grammar state.

Not a test (pytest does not collect it). Loads the target (no context to speak of), compiles
JSON_GBNF and a JSON schema's grammar, and times `allowed` on 1, 16 and 256 tokens and on the whole
vocabulary, at the start of the output and inside a string (where nearly every token is allowed and
the grammar must walk each one's text), plus compiling and cloning. The median of repeats.

Usage: python tests/perf/grammar_cost.py TARGET [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specchat.decoding.constraint import GrammarSpec
from specchat.llama.engine import LlamaModel, LoadOptions
from specchat.llama.grammar import Grammar, gbnf_for

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    model = LlamaModel(Path(args.target), LoadOptions(n_ctx=256, threads=1))
    ids = np.arange(model.n_vocab, dtype=np.int32)
    print(f"{model.name}: {model.n_vocab} tokens")
    specs = (
        ("json_object", GrammarSpec("json_object")),
        ("schema", GrammarSpec("json_schema", schema=SCHEMA)),
    )
    for label, spec in specs:
        text = gbnf_for(spec)
        compile_s = median_seconds(lambda text=text: Grammar(model, text).close(), args.repeats)
        grammar = Grammar(model, text)
        clone_s = median_seconds(lambda grammar=grammar: grammar.start().close(), args.repeats)
        print(f"{label}: compile {compile_s * 1e3:.2f} ms, clone+free {clone_s * 1e6:.1f} us")
        for where, prefix in (("start", ""), ("in a string", '{"name": "Ad')):
            state = grammar.start()
            for tok in model.tokenize(prefix, add_special=False, parse_special=False):
                state.accept(tok)
            cells = []
            for n in (1, 16, 256, model.n_vocab):
                part = ids[:n].copy() if n < model.n_vocab else ids
                took = median_seconds(lambda part=part, state=state: state.allowed(part), args.repeats)
                cells.append(f"{n}: {took * 1e6:,.0f} us")
            allowed = int(state.allowed(ids).sum())
            print(f"  {where} ({allowed:,} allowed): " + ", ".join(cells))
            state.close()
        grammar.close()
    model.close()


if __name__ == "__main__":
    main()
