"""Side by side, interleaved: specchat's DFlash block drafter against llama-server's `draft-dflash`.

Not a test (pytest does not collect it). Every configuration runs as its own process, one at a time,
repeat 1 of all of them, then repeat 2 ... (each starting one configuration further on): specchat `run
--raw --json` plain and with `--draft dflash:model=D` (the auto planner) and `-k N --draft-p-min 0`, and
llama-server on 127.0.0.1 plain and with `-md D --spec-type draft-dflash --spec-draft-n-max N
--spec-draft-p-min 0`, for N in 4, 8, 15; the same text with no template, greedy, the same number of
tokens. Decode speed only (prompt processing excluded): specchat's stats and llama-server's
`timings.predicted_per_second`; acceptance from specchat's stats and llama-server's `draft_n` /
`draft_n_accepted`. Ratios are to specchat's plain decoding in the same run; every output is compared
token for token with specchat's plain one.

The files: a planted Qwen3 target and its DFlash drafter (tests/dflash_models.py), by default in
~/.cache/specchat-dev/dflash, written with

    python -m tests.dflash_models ~/.cache/specchat-dev/dflash \\
        --vocab-from ~/.cache/specchat-dev/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

(`--dspark` adds dspark-target.gguf, a DSpark drafter, run with `--kind dspark` against
llama-server's `draft-dspark`; `--dflash2` adds dflash2-target.gguf, run with `--kind dflash2`).

Usage:
  python tests/perf/dflash_vs_llama.py LLAMA_BIN_DIR [--target T --drafter D]
      [--kind dflash|dflash2|dspark]
      [-n 200] [--repeats 2] [--n-max 4,8,15] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hybrid_vs_llama import prompt_text, run_llama, run_specchat  # noqa: E402

MODELS = Path.home() / ".cache" / "specchat-dev" / "dflash"


def configs(
    drafter: str, n_max: list[int], kind: str = "dflash"
) -> dict[str, tuple[str, list[str], int | None]]:
    """name -> ("specchat" | "llama", extra arguments, drafts per round); `kind` dflash, dflash2 (run
    as dflash by both) or dspark."""
    spec = "dflash" if kind == "dflash2" else kind
    out: dict[str, tuple[str, list[str], int | None]] = {
        "specchat plain": ("specchat", ["--no-draft"], None),
        "llama plain": ("llama", [], None),
        # what a user runs: the block drafter under the auto planner, no depth or threshold given
        f"specchat {kind} auto": ("specchat", ["--draft", f"{spec}:model={drafter}"], None),
    }
    for n in n_max:
        out[f"specchat {kind} -k {n}"] = (
            "specchat",
            ["--draft", f"{spec}:model={drafter}", "-k", str(n), "--draft-p-min", "0"],
            n,
        )
        out[f"llama draft-{kind} n{n}"] = (
            "llama",
            [
                "-md",
                drafter,
                "--spec-type",
                f"draft-{spec}",
                "--spec-draft-n-max",
                str(n),
                "--spec-draft-p-min",
                "0",
            ],
            n,
        )
    return out


def acceptance(kind: str, stats: dict, n: int, n_max: int | None) -> str:
    """What each side says of its drafts. They count differently: specchat's `drafted` stops at the
    first rejected token of a round (the tokens after it are never judged), llama-server's counts
    every drafted token; tokens per target pass compares them (llama-server's estimated as `n`
    over its rounds, each of which drafts n-max tokens with --spec-draft-p-min 0)."""
    if kind == "specchat":
        if not stats.get("drafted"):
            return ""
        return (
            f"accepted {stats['accepted']} of {stats['drafted']} judged, "
            f"{stats['tokens_per_pass']:.2f} tokens/pass"
        )
    drafted, accepted = stats.get("draft_n"), stats.get("draft_n_accepted")
    if not drafted or not n_max:
        return ""
    return f"accepted {accepted} of {drafted} drafted, ~{n / (drafted / n_max):.2f} tokens/pass"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_bin", type=Path)
    ap.add_argument("--target", type=Path, default=MODELS / "target.gguf")
    ap.add_argument("--drafter", type=Path, default=MODELS / "dflash-target.gguf")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n-max", default="4,8,15")
    ap.add_argument("--kind", default="dflash", choices=["dflash", "dflash2", "dspark"], help="drafter kind")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cfgs = configs(str(args.drafter), [int(x) for x in args.n_max.split(",")], args.kind)
    prompt = prompt_text(args.prompt_tokens)
    target = str(args.target)
    speeds: dict[str, list[float]] = {k: [] for k in cfgs}
    outputs: dict[str, list[int]] = {}
    stats: dict[str, dict] = {}
    names = list(cfgs)
    for rep in range(args.repeats):  # each repeat starts one configuration further on
        for cfg in names[rep % len(names) :] + names[: rep % len(names)]:
            kind, extra, n_max = cfgs[cfg]
            if kind == "specchat":
                tps, toks, st = run_specchat(target, prompt, args.n, extra)
            else:
                tps, toks, st = run_llama(args.llama_bin, target, prompt, args.n, extra)
            speeds[cfg].append(tps)
            outputs.setdefault(cfg, toks)
            stats[cfg] = st
            print(f"{cfg}: {tps:.2f} tok/s {acceptance(kind, st, args.n, n_max)}", flush=True)
    base = statistics.median(speeds["specchat plain"])
    plain_out = outputs["specchat plain"]
    print(f"\n~{args.prompt_tokens}-token prompt, {args.n} tokens, greedy, medians of {args.repeats}:")
    results = []
    for cfg, v in speeds.items():
        med = statistics.median(v)
        kind, _, n_max = cfgs[cfg]
        same = outputs[cfg] == plain_out if outputs[cfg] else None
        mark = "" if same is None else (" same" if same else " DIFFERS")
        said = acceptance(kind, stats[cfg], args.n, n_max)
        print(f"  {cfg:26s} {med:8.2f} tok/s  {med / base:5.2f}x{mark}  {said}")
        results.append({"config": cfg, "median": med, "ratio": med / base, "runs": v, "equal_plain": same,
                        "stats": stats[cfg]})  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
