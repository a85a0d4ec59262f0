"""The F16 stand-in (../shared/models/make-big-target.sh) with the default draft: specchat plain, the
default and forced depths against llama-speculative-simple's draft settings, interleaved per prompt.

Not a test (pytest does not collect it). Run from the repository root:
  python tests/perf/f16_standin_check.py [-n 96] [--prompts 2] [--target GGUF]
`--target` measures another target with the same draft and settings (the default pair's Q4_K_M).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vs_llama_cpp import chatml, run_llama, run_specchat  # noqa: E402

MODELS = Path.home() / ".cache" / "specchat-dev" / "models"
BIN = Path.home() / ".cache/specchat-dev/llama.cpp-ref/llama.cpp/build/bin/llama-speculative-simple"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--target", default=str(MODELS / "qwen2.5-coder-1.5b-instruct-F16.gguf"))
    args = ap.parse_args()
    target = args.target
    draft = str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    lines = (HERE / "bench_prompts.jsonl").read_text().splitlines()[: args.prompts]
    docs = [json.loads(line) for line in lines]
    prompts = [(d["name"], chatml([{"role": "user", "content": d["prompt"]}])) for d in docs]
    ours = {
        "specchat plain": ["--no-draft"],
        "specchat default": ["--draft", draft, "--draft", "ngram"],
        "specchat -k 4": ["--draft", draft, "-k", "4"],
        "specchat -k 8 p0.5": ["--draft", draft, "-k", "8", "--draft-p-min", "0.5"],
    }
    simple = ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-min", "0", "-td", "2"]
    theirs = {
        "llama.cpp draft n8 p0.5": [*simple, "--spec-draft-n-max", "8", "--draft-p-min", "0.5"],
        "llama.cpp draft n4 p0.75": [*simple, "--spec-draft-n-max", "4", "--draft-p-min", "0.75"],
    }
    speeds: dict[str, list[float]] = {k: [] for k in [*ours, *theirs]}
    for name, text in prompts:
        reference = None
        for cfg, extra in ours.items():
            got = run_specchat(target, text, args.n, extra)
            speeds[cfg].append(float(got["tps"]))
            reference = reference or got["tokens"]
            same = "equal" if got["tokens"] == reference else "DIFFERS"
            print(f"{name} {cfg}: {got['tps']:.2f} tok/s {same}", flush=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        for cfg, extra in theirs.items():
            got = run_llama(BIN, target, f.name, args.n, extra)
            speeds[cfg].append(got["tps"])
            print(f"{name} {cfg}: {got['tps']:.2f} tok/s", flush=True)
    base = statistics.median(speeds["specchat plain"])
    for cfg, values in speeds.items():
        med = statistics.median(values)
        print(f"{cfg:28} {med:7.2f} tok/s {med / base:5.2f}x")


if __name__ == "__main__":
    main()
