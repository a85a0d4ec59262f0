"""Side by side, interleaved: llama.cpp's own n-gram speculative modes vs specchat, same prompts.

Not a test (pytest does not collect it): the reproduction of README's "specchat vs llama.cpp" table.
Each prompt is rendered once as a raw ChatML prompt (Qwen2.5's template, its default system line), so
`llama-speculative-simple -f FILE` and `specchat run --raw` decode exactly the same tokens. Every
configuration runs as its own process, one at a time, in interleaved order (repeat 1 of every
configuration, then repeat 2, ...), so a slow spell of the machine hits all of them alike. Decode
speed only (prompt processing excluded), greedy. Ratios are to specchat's plain decoding measured in
the same run; specchat's speculative outputs are also compared token for token with its plain one.

Usage:
  python tests/perf/vs_llama_cpp.py LLAMA_BIN_DIR TARGET.gguf DRAFT.gguf [--prompts FILE] [-n N]
      [--repeats R] [--only NAME,NAME] [--configs NAME,NAME] [--json OUT]
LLAMA_BIN_DIR holds llama-speculative-simple (../shared/tools/build-llama-cpp.sh prints it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(messages: list[dict[str, str]]) -> str:
    """Qwen2.5's chat template, as its GGUF applies it (default system line when none is given)."""
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": SYSTEM}, *messages]
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def llama_cpp_configs(target: str, draft: str) -> dict[str, list[str]]:
    """llama-speculative-simple arguments per configuration (after -m TARGET -f FILE)."""
    del target
    return {
        "llama.cpp ngram-simple": ["--spec-type", "ngram-simple"],
        "llama.cpp ngram-simple n4 m16": [
            "--spec-type", "ngram-simple",
            "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "16",
        ],
        "llama.cpp ngram-mod m8 2-16": [
            "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2",
            "--spec-ngram-mod-n-max", "16",
        ],
        "llama.cpp ngram-mod": ["--spec-type", "ngram-mod"],
        "llama.cpp draft k3": [
            "-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--spec-draft-n-min", "0",
            "--draft-p-min", "0.75", "-td", "2",
        ],
        # the draft settings that win where the draft model pays (a big target)
        "llama.cpp draft n8 p0.5": [
            "-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "--spec-draft-n-min", "0",
            "--draft-p-min", "0.5", "-td", "2",
        ],
        "llama.cpp draft n16 p0.5": [
            "-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "16",
            "--spec-draft-n-min", "0", "--draft-p-min", "0.5", "-td", "2",
        ],
    }  # fmt: skip


def specchat_configs(draft: str) -> dict[str, list[str]]:
    return {
        "specchat plain": ["--no-draft"],
        "specchat auto (draft+ngram)": ["--draft", draft, "--draft", "ngram"],
        "specchat auto --strict": ["--draft", draft, "--draft", "ngram", "--strict"],
        "specchat ngram auto": ["--draft", "ngram"],
        "specchat ngram -k 8": ["--draft", "ngram", "-k", "8"],
        "specchat draft auto": ["--draft", draft],
        "specchat draft -k 4 p0.5": ["--draft", draft, "-k", "4", "--draft-p-min", "0.5"],
        "specchat draft -k 8 p0.5": ["--draft", draft, "-k", "8", "--draft-p-min", "0.5"],
        "specchat draft -k 16 p0.3": ["--draft", draft, "-k", "16", "--draft-p-min", "0.3"],
    }


def run_llama(binary: Path, target: str, prompt_file: str, n: int, extra: list[str]) -> dict[str, float]:
    cmd = [str(binary), "-m", target, "-f", prompt_file, "-n", str(n), "--temp", "0", "-t", "2", "-c", "4096",
           "-s", "1", *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+)", out.stderr)
    if out.returncode != 0 or not speed:
        raise SystemExit(f"llama.cpp failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    rate = re.search(r"accept\s+=\s+([\d.]+)%", out.stderr)
    return {"tps": float(speed.group(3)), "acceptance": float(rate.group(1)) / 100 if rate else 0.0}


def run_specchat(target: str, prompt: str, n: int, extra: list[str]) -> dict[str, object]:
    cmd = [sys.executable, "-m", "specchat", "run", target, "--raw", "--temp", "0", "-n", str(n), "--json",
           "-t", "2", "-c", "4096", *extra]  # fmt: skip
    out = subprocess.run(cmd, input=prompt, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"specchat failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout)
    s = doc["stats"]
    return {"tps": s["tokens_per_second"], "acceptance": s["acceptance_rate"], "tokens": doc["tokens"],
            "tokens_per_pass": s["tokens_per_pass"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--prompts", type=Path, default=HERE / "copy_prompts.jsonl")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="", help="prompt names, comma-separated")
    ap.add_argument("--configs", default="", help="configuration names (substrings), comma-separated")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    binary = args.bin_dir / "llama-speculative-simple"
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    if args.only:
        prompts = [p for p in prompts if p["name"] in args.only.split(",")]
    configs: dict[str, tuple[str, list[str]]] = {}
    for name, extra in specchat_configs(args.draft).items():
        configs[name] = ("specchat", extra)
    for name, extra in llama_cpp_configs(args.target, args.draft).items():
        configs[name] = ("llama", extra)
    if args.configs:
        wanted = args.configs.split(",")
        configs = {k: v for k, v in configs.items() if k == "specchat plain" or any(w in k for w in wanted)}
    results: dict[str, dict[str, list[dict[str, object]]]] = {
        p["name"]: {c: [] for c in configs} for p in prompts
    }
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for p in prompts:
            text = chatml(p["messages"])
            files[p["name"]] = (text, os.path.join(tmp, p["name"] + ".txt"))
            Path(files[p["name"]][1]).write_text(text)
        for rep in range(args.repeats):
            for p in prompts:
                text, path = files[p["name"]]
                for cname, (kind, extra) in configs.items():
                    if kind == "llama":
                        r = run_llama(binary, args.target, path, args.n, extra)
                    else:
                        r = run_specchat(args.target, text, args.n, extra)
                    results[p["name"]][cname].append(r)
                    print(f"[{rep + 1}/{args.repeats}] {p['name']:14s} {cname:30s} {r['tps']:7.2f} tok/s",
                          file=sys.stderr, flush=True)  # fmt: skip
    summary: dict[str, dict[str, float]] = {}
    print(f"\n{'prompt':14s} " + " ".join(f"{c[:22]:>22s}" for c in configs))
    for p in prompts:
        row = results[p["name"]]
        base = statistics.median(float(r["tps"]) for r in row["specchat plain"])  # type: ignore[arg-type]
        plain_tokens = row["specchat plain"][0]["tokens"]
        summary[p["name"]] = {}
        cells = []
        for c in configs:
            med = statistics.median(float(r["tps"]) for r in row[c])  # type: ignore[arg-type]
            summary[p["name"]][c] = med / base
            same = ""
            if c.startswith("specchat") and c != "specchat plain":
                same = "" if all(r["tokens"] == plain_tokens for r in row[c]) else "≠"
            cells.append(f"{med:6.1f} {med / base:4.2f}x{same:1s}".rjust(22))
        print(f"{p['name']:14s} " + " ".join(cells))
    geo = [math.exp(statistics.fmean(math.log(summary[p["name"]][c]) for p in prompts)) for c in configs]
    print(f"{'geomean':14s} " + " ".join(f"{g:21.2f}x" for g in geo))
    print("\ncells: median decode tok/s and ratio to specchat plain in this run; ≠ marks a specchat output "
          "that differs from its plain output")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": summary}, indent=1))


if __name__ == "__main__":
    main()
