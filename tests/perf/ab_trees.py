"""Two source trees of specchat side by side, interleaved, on the same prompts: is a change a regression?

Not a test (pytest does not collect it). Each configuration runs `python -m specchat run --raw --json`
with PYTHONPATH set to a tree (a worktree of an older commit, say), the same installed llama-cpp-python
for both, in its own process, one at a time: repeat 1 of every (prompt, tree, configuration), then
repeat 2 ... Prompts are rendered once as raw ChatML (vs_llama_cpp.py's `chatml`), so both trees decode
the same tokens. Decode speed only; ratios are to tree A's plain decoding in the same run, and every
output is compared token for token with it.

Usage:
  python tests/perf/ab_trees.py TREE_A TREE_B TARGET.gguf [--draft DRAFT.gguf] [--prompts FILE]
      [--only NAME,...] [-n 200] [--repeats 2] [--config "default=" --config "k3=-k 3" ...]
A configuration is NAME=ARGS (ARGS as `specchat run` takes them; empty: the defaults, which load
DRAFT and n-gram lookup when --draft is given). `plain` (--no-draft) always runs, on tree A.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from vs_llama_cpp import chatml  # noqa: E402


def run(tree: Path, target: str, prompt: str, n: int, extra: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "specchat", "run", target, "--raw", "--temp", "0", "-n", str(n), "--json",
           "-t", "2", "-c", "4096", *extra]  # fmt: skip
    out = subprocess.run(cmd, input=prompt, capture_output=True, text=True, check=False, env=env, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"specchat failed in {tree} ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout)
    return {"tps": doc["stats"]["tokens_per_second"], "tokens": doc["tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a", type=Path)
    ap.add_argument("tree_b", type=Path)
    ap.add_argument("target")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--prompts", type=Path, default=HERE / "copy_prompts.jsonl")
    ap.add_argument("--only", default="")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", action="append", default=[], help="NAME=ARGS (repeatable)")
    args = ap.parse_args()
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    if args.only:
        prompts = [p for p in prompts if p["name"] in args.only.split(",")]
    drafts = ["--draft", args.draft, "--draft", "ngram"] if args.draft else []
    configs = {"plain": ("a", ["--no-draft"])}
    for spec in args.config or ["default="]:
        name, _, rest = spec.partition("=")
        extra = shlex.split(rest) or drafts
        configs[f"A {name}"] = ("a", extra)
        configs[f"B {name}"] = ("b", extra)
    trees = {"a": args.tree_a.resolve(), "b": args.tree_b.resolve()}
    results = {p["name"]: {c: [] for c in configs} for p in prompts}
    for rep in range(args.repeats):
        for p in prompts:
            text = chatml(p["messages"])
            for cname, (tree, extra) in configs.items():
                r = run(trees[tree], args.target, text, args.n, extra)
                results[p["name"]][cname].append(r)
                print(f"[{rep + 1}/{args.repeats}] {p['name']:14s} {cname:20s} {r['tps']:7.2f} tok/s",
                      file=sys.stderr, flush=True)  # fmt: skip
    print(f"\n{'prompt':14s} " + " ".join(f"{c[:18]:>18s}" for c in configs))
    ratios: dict[str, list[float]] = {c: [] for c in configs}
    for p in prompts:
        row = results[p["name"]]
        base = statistics.median(float(r["tps"]) for r in row["plain"])
        plain = row["plain"][0]["tokens"]
        cells = []
        for c in configs:
            med = statistics.median(float(r["tps"]) for r in row[c])
            ratios[c].append(med / base)
            same = "" if all(r["tokens"] == plain for r in row[c]) else "≠"
            cells.append(f"{med:6.1f} {med / base:4.2f}x{same:1s}".rjust(18))
        print(f"{p['name']:14s} " + " ".join(cells))
    geo = [math.exp(statistics.fmean(math.log(x) for x in ratios[c])) for c in configs]
    print(f"{'geomean':14s} " + " ".join(f"{g:17.2f}x" for g in geo))
    print("\ncells: median decode tok/s and ratio to plain (tree A) in this run; ≠ marks an output that "
          "differs from plain's")  # fmt: skip


if __name__ == "__main__":
    main()
