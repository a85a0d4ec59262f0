"""Side by side, interleaved: specchat against llama-server on hybrid targets and MTP drafters.

Not a test (pytest does not collect it). For each pair of files (a hybrid target and its draft, or a
target with its own MTP drafter) and each prompt, every configuration runs as its own process, one at
a time, repeat 1 of all of them, then repeat 2 ... (each repeat starting one configuration further
on, so that none always runs right after another: on a shared VM a process's speed depends on the
one before it): specchat `run --raw --json` (plain, the default,
forced drafts) and llama-server on 127.0.0.1 (plain, `-md DRAFT --spec-type draft-simple`,
`--spec-type ngram-mod`, `--spec-type draft-mtp --spec-draft-n-max N`), each given the same text with
no template, greedy, the same number of tokens. Decode speed only (prompt processing excluded):
specchat's stats and llama-server's `timings.predicted_per_second`. Ratios are to specchat's plain
decoding in the same run; every specchat output is compared token for token with its plain one.

The files come from tests/perf/hybrid_models.py (random weights of the real layouts with a planted
rule, ~/.cache/specchat-dev/hybrid). llama-server comes from ../shared/tools/build-llama-cpp.sh.

Usage:
  python tests/perf/hybrid_vs_llama.py LLAMA_BIN_DIR --pair qwen35 [--pair lfm2 ...] [--prompt-tokens
      100,2000] [-n 128] [--repeats 2] [--only-configs NAME,...] [--json OUT]
Pairs: qwen35 (12x1024 F16 + qwen2 draft), lfm2 (16x2048 Q8_0 + 16x1024 draft), qwen35-mtp (16x2048 Q8_0
with a NextN block), gemma4 (12x1024 F16 + its assistant).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS = Path.home() / ".cache" / "specchat-dev" / "hybrid"
PAIRS: dict[str, dict[str, str]] = {
    "qwen35": {"target": "qwen35-12x1024-f16.gguf", "draft": "qwen2-2x512-f16.gguf"},
    "lfm2": {"target": "lfm2-16x2048-q8_0.gguf", "draft": "lfm2-16x1024-q8_0.gguf"},
    "qwen35-mtp": {"target": "qwen35-16x2048-q8_0-mtp.gguf", "mtp": "nextn"},
    "gemma4": {"target": "gemma4-12x1024-f16.gguf", "assistant": "gemma4-assistant-4x256-f16.gguf"},
}
#: plain English text the prompts are cut from (repeated as needed): the project's own docs
TEXT_SOURCES = ("README.md", "docs/how-it-works.md", "docs/server-api.md", "docs/performance.md")


def configs(pair: dict[str, str]) -> dict[str, tuple[str, list[str]]]:
    """name -> ("specchat" | "llama", extra arguments)."""
    out: dict[str, tuple[str, list[str]]] = {
        "specchat plain": ("specchat", ["--no-draft"]),
        "specchat default": ("specchat", []),
        "llama plain": ("llama", []),
        "llama ngram-mod": ("llama", ["--spec-type", "ngram-mod"]),
    }
    if "draft" in pair:
        d = str(MODELS / pair["draft"])
        out["specchat draft -k 4"] = ("specchat", ["--draft", d, "-k", "4", "--draft-p-min", "0"])
        out["specchat draft auto"] = ("specchat", ["--draft", d, "--draft", "ngram"])
        out["llama draft n4"] = (
            "llama",
            ["-md", d, "--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
        )
    if "mtp" in pair or "assistant" in pair:
        head = ["-md", str(MODELS / pair["assistant"])] if "assistant" in pair else []
        # an assistant file is found by default only as `mtp-*.gguf` beside the target: name it here
        mtp = f"mtp:assistant={MODELS / pair['assistant']}" if "assistant" in pair else "mtp"
        if "assistant" in pair:
            out["specchat auto (assistant+ngram)"] = ("specchat", ["--draft", mtp, "--draft", "ngram"])
        for n in (1, 2, 3):
            out[f"specchat mtp -k {n}"] = ("specchat", ["--draft", mtp, "-k", str(n), "--draft-p-min", "0"])
            out[f"llama draft-mtp n{n}"] = (
                "llama",
                [*head, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n)],
            )
    return out


def prompt_text(tokens: int) -> str:
    """About `tokens` tokens of English (4 characters a token), cut at a word."""
    text = "\n\n".join((ROOT / p).read_text() for p in TEXT_SOURCES)
    while len(text) < 4 * tokens:
        text += "\n\n" + text
    cut = text[: 4 * tokens]
    return cut[: cut.rfind(" ")]


def run_specchat(target: str, prompt: str, n: int, extra: list[str]) -> tuple[float, list[int], dict]:
    argv = [sys.executable, "-m", "specchat", "run", target, "--raw", "--json", "--temp", "0", "-n", str(n),
            "-t", "2", "-c", "4096", *extra]  # fmt: skip
    done = subprocess.run(argv, input=prompt, capture_output=True, text=True, check=True, cwd=ROOT)
    doc = json.loads(done.stdout)
    return float(doc["stats"]["tokens_per_second"]), list(doc["tokens"]), doc["stats"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_llama(
    bin_dir: Path, target: str, prompt: str, n: int, extra: list[str]
) -> tuple[float, list[int], dict]:
    port = _free_port()
    argv = [str(bin_dir / "llama-server"), "-m", target, "--host", "127.0.0.1", "--port", str(port),
            "-t", "2", "-c", "4096", "-np", "1", "--no-webui", *extra]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(
                        f"llama-server did not start: {log.read()[-2000:].decode(errors='replace')}"
                    )
                time.sleep(0.5)
            body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                    "return_tokens": True, "samplers": ["top_k"], "ignore_eos": True}  # fmt: skip
            req = urllib.request.Request(
                url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=3600) as r:
                doc = json.loads(r.read())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    t = doc.get("timings", {})
    stats = {"draft_n": t.get("draft_n"), "draft_n_accepted": t.get("draft_n_accepted")}
    return float(t["predicted_per_second"]), list(doc.get("tokens", [])), stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_bin", type=Path)
    ap.add_argument("--pair", action="append", choices=sorted(PAIRS), required=True)
    ap.add_argument("--prompt-tokens", default="100,2000")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only-configs", default="")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    only = {c.strip() for c in args.only_configs.split(",") if c.strip()}
    results: list[dict] = []
    for name in args.pair:
        pair = PAIRS[name]
        target = str(MODELS / pair["target"])
        cfgs = {k: v for k, v in configs(pair).items() if not only or k in only or k == "specchat plain"}
        for size in (int(x) for x in args.prompt_tokens.split(",")):
            prompt = prompt_text(size)
            speeds: dict[str, list[float]] = {k: [] for k in cfgs}
            outputs: dict[str, list[int]] = {}
            extra_stats: dict[str, dict] = {}
            names = list(cfgs)
            for rep in range(args.repeats):
                for cfg in names[rep % len(names) :] + names[: rep % len(names)]:
                    kind, extra = cfgs[cfg]
                    if kind == "specchat":
                        tps, toks, st = run_specchat(target, prompt, args.n, extra)
                    else:
                        tps, toks, st = run_llama(args.llama_bin, target, prompt, args.n, extra)
                    speeds[cfg].append(tps)
                    outputs.setdefault(cfg, toks)
                    extra_stats[cfg] = st
                    print(f"{name} ~{size} {cfg}: {tps:.2f} tok/s", flush=True)
            base = statistics.median(speeds["specchat plain"])
            plain_out = outputs["specchat plain"]
            print(f"\n{name}, ~{size}-token prompt, {args.n} tokens, medians of {args.repeats}:")
            for cfg, v in speeds.items():
                med = statistics.median(v)
                same = (
                    ""
                    if not cfg.startswith("specchat")
                    else (" same" if outputs[cfg] == plain_out else " DIFFERS")
                )
                print(
                    f"  {cfg:26s} {med:8.2f} tok/s  {med / base:5.2f}x{same}  runs {[round(x, 2) for x in v]}"
                )
                equal = outputs[cfg] == plain_out if cfg.startswith("specchat") else None
                results.append({"pair": name, "prompt_tokens": size, "config": cfg, "median": med,
                                "ratio": med / base, "runs": v, "equal_plain": equal,
                                "stats": extra_stats[cfg]})  # fmt: skip
            print()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
