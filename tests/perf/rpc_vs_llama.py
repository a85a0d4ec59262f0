"""A target split over this process and an RPC worker behind a latency proxy: specchat against
llama-server `--rpc`, side by side, interleaved.

Not a test (pytest does not collect it). One `specchat worker` on 127.0.0.1 computes the target's last
layers for every configuration; `latency_proxy.py` sits in front of it and adds `--delay-ms` each way
(2 ms: a LAN or Wi-Fi link). Each configuration runs as its own process, one at a time, repeat 1 of all
of them, then repeat 2 ...:

- specchat `run --raw --json`: plain and the default drafting (the registry's draft and n-gram lookup,
  auto), unsplit, split straight to the worker (loopback) and split through the proxy;
- llama-server `--rpc` through the proxy, the same `-ngl` split: plain, and `-md DRAFT` (draft kept
  local with `-ngld 0`) at several `--spec-draft-n-max` / `--draft-p-min` settings;
- with `--other-checkout DIR`: specchat plain and default through the proxy again, run from another
  checkout of specchat on the same llama-cpp-python (`other proxy plain`, `other proxy default`), to
  set a change of the split against the code before it in the same interleaved run.

`--gpu-layers` is llama.cpp's count (`-ngl`), the output layer counted as one: llama-server puts the
output layer on the worker with the others; specchat keeps it on this machine (the same repeating
layers on each side), so its verify passes bring back hidden states rather than logits.

Same raw ChatML text, greedy, the same number of tokens, 2 threads everywhere. Decode speed only:
specchat's stats, llama-server's `timings.predicted_per_second`. Printed per configuration: the median
tok/s, its ratio to its own plain decoding over the same link (pooled, and per prompt with their
geometric mean: prompts differ more than configurations), and whether every specchat output equals
unsplit plain decoding token for token.

Usage:
  python tests/perf/rpc_vs_llama.py LLAMA_BIN_DIR TARGET.gguf DRAFT.gguf [--gpu-layers 15]
      [--delay-ms 2] [-n 128] [--repeats 2] [--prompts 3] [--other-checkout DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from hybrid_vs_llama import run_llama  # noqa: E402
from latency_proxy import latency_proxy  # noqa: E402
from vs_llama_cpp import chatml  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompts(count: int) -> list[tuple[str, str]]:
    """(name, raw ChatML) from the code prompts and the held-out chat/edit prompts, alternating."""
    out = []
    for file in ("bench_prompts.jsonl", "heldout_prompts.jsonl"):
        for line in (HERE / file).read_text().splitlines():
            doc = json.loads(line)
            messages = doc.get("messages") or [{"role": "user", "content": doc["prompt"]}]
            out.append((doc["name"], chatml(messages)))
    picked = [p for pair in zip(out[::2], out[1::2], strict=False) for p in pair]
    return picked[:count]


def run_specchat(
    target: str, prompt: str, n: int, extra: list[str], checkout: Path = ROOT
) -> tuple[float, list[int], dict]:
    argv = [sys.executable, "-m", "specchat", "run", target, "--raw", "--json", "--temp", "0", "-n", str(n),
            "-t", "2", "-c", "4096", *extra]  # fmt: skip
    done = subprocess.run(argv, input=prompt, capture_output=True, text=True, cwd=checkout)
    if done.returncode != 0:
        raise SystemExit(f"specchat failed ({' '.join(argv)}):\n{done.stderr[-3000:]}")
    doc = json.loads(done.stdout)
    return float(doc["stats"]["tokens_per_second"]), list(doc["tokens"]), doc["stats"]


def cost_model(target: str, extra: list[str], checkout: Path = ROOT) -> list[str]:
    """`run --verbose`'s split and cost-model lines (calibration through the workers for a split
    target)."""
    argv = [sys.executable, "-m", "specchat", "run", target, "--raw", "--temp", "0", "-n", "4", "-t", "2",
            "-c", "4096", "--verbose", "-p", "hello", *extra]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=checkout)
    return [
        ln.strip() for ln in done.stderr.splitlines() if ln.strip().startswith(("cost model", "target split"))
    ]


def start_worker(port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "specchat", "worker", "--port", str(port), "--threads", "2"]
    # its output is a line per connection: to a file, as a pipe nobody reads fills up and stops it
    log = open(Path(tempfile.gettempdir()) / f"specchat-worker-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    from specchat.errors import WorkerError
    from specchat.llama.rpc_wire import Endpoint, probe

    deadline = time.monotonic() + 60
    while True:
        try:
            probe(Endpoint("127.0.0.1", port), timeout=5)
            return proc
        except WorkerError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start (its log: {log.name})") from None
            time.sleep(0.3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument(
        "--gpu-layers", type=int, default=15, help="llama.cpp's -ngl: layers offloaded, the output counted"
    )
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ports", help="WORKER,PROXY (fixed ports keep the split's calibration between runs)")
    ap.add_argument(
        "--other-checkout", type=Path, help="also run the proxy configurations from this checkout"
    )
    args = ap.parse_args()

    wport, pport = map(int, args.ports.split(",")) if args.ports else (free_port(), free_port())
    direct, proxied = f"127.0.0.1:{wport}", f"127.0.0.1:{pport}"
    ngl = str(args.gpu_layers)
    split = ["--gpu-layers", ngl]
    spec = ["--draft", args.draft, "--draft", "ngram"]
    configs: dict[str, tuple[str, list[str]]] = {
        "specchat plain": ("specchat", ["--no-draft"]),
        "specchat default": ("specchat", spec),
        "specchat split plain": ("specchat", ["--no-draft", "--rpc", direct, *split]),
        "specchat split default": ("specchat", [*spec, "--rpc", direct, *split]),
        "specchat proxy plain": ("specchat", ["--no-draft", "--rpc", proxied, *split]),
        "specchat proxy default": ("specchat", [*spec, "--rpc", proxied, *split]),
    }
    if args.other_checkout:
        configs["other proxy plain"] = ("other", ["--no-draft", "--rpc", proxied, *split])
        configs["other proxy default"] = ("other", [*spec, "--rpc", proxied, *split])
    configs |= {
        "llama-server proxy plain": ("llama", ["--rpc", proxied, "-ngl", ngl]),
    }
    for n_max, p_min in ((4, 0.75), (8, 0.5), (16, 0.5)):
        configs[f"llama-server proxy -md n{n_max} p{p_min}"] = (
            "llama",
            ["--rpc", proxied, "-ngl", ngl, "-md", args.draft, "-ngld", "0", "-td", "2",
             "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--draft-p-min", str(p_min)],
        )  # fmt: skip
    if args.only:
        keep = set(args.only.split(","))
        configs = {k: v for k, v in configs.items() if k in keep or k.endswith(" plain")}

    items = prompts(args.prompts)
    speeds: dict[str, list[float]] = {name: [] for name in configs}
    equal: dict[str, bool] = {name: True for name in configs}
    accept: dict[str, list[float]] = {name: [] for name in configs}
    per_pass: dict[str, list[float]] = {name: [] for name in configs}
    by_prompt: dict[tuple[str, str], list[float]] = {}
    worker = start_worker(wport)
    try:
        with latency_proxy(pport, direct, args.delay_ms):
            # the verify curve the planner drafts by, on one machine, over loopback and through the proxy
            names = (
                "specchat default",
                "specchat split default",
                "specchat proxy default",
                "other proxy default",
            )
            for name in names:
                if name in configs:
                    where = args.other_checkout if configs[name][0] == "other" else ROOT
                    print(
                        f"{name}: " + "; ".join(cost_model(args.target, configs[name][1], where)), flush=True
                    )
            for rep in range(args.repeats):
                for pname, text in items:
                    reference: list[int] | None = None
                    for name, (kind, extra) in configs.items():
                        if kind in ("specchat", "other"):
                            where = args.other_checkout if kind == "other" else ROOT
                            tps, tokens, stats = run_specchat(args.target, text, args.n, extra, where)
                            if reference is None:
                                reference = tokens
                            equal[name] &= tokens == reference
                            accept[name].append(float(stats.get("acceptance_rate") or 0.0))
                            per_pass[name].append(float(stats.get("tokens_per_pass") or 1.0))
                        else:
                            tps, _tokens, stats = run_llama(args.bin_dir, args.target, text, args.n, extra)
                            if stats.get("draft_n"):
                                accept[name].append(stats["draft_n_accepted"] / stats["draft_n"])
                        speeds[name].append(tps)
                        by_prompt.setdefault((name, pname), []).append(tps)
                        print(f"rep {rep + 1} {pname:22} {name:36} {tps:7.2f} tok/s", flush=True)
    finally:
        worker.send_signal(signal.SIGINT)  # as Ctrl-C would stop it
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:  # started from a background job, it inherits SIGINT ignored
            worker.kill()
            worker.wait()

    med = {name: statistics.median(v) for name, v in speeds.items()}
    plain_of = {
        "specchat plain": "specchat plain", "specchat default": "specchat plain",
        "specchat split plain": "specchat split plain", "specchat split default": "specchat split plain",
        "other proxy plain": "other proxy plain", "other proxy default": "other proxy plain",
    }  # fmt: skip
    print(f"\n+{args.delay_ms} ms each way, {args.gpu_layers} layers on the worker, {len(items)} prompts x "
          f"{args.repeats} repeats, {args.n} tokens, medians:")  # fmt: skip
    rows = []
    for name in configs:
        base = plain_of.get(name) or (
            "specchat proxy plain" if name.startswith("specchat") else "llama-server proxy plain"
        )
        ratio = med[name] / med[base]
        # the prompts differ by far more than the configurations (a copy runs at twice a fresh answer's
        # speed): a ratio per prompt, and their geometric mean, say more than the pooled medians'
        per = [
            statistics.median(by_prompt[(name, pname)]) / statistics.median(by_prompt[(base, pname)])
            for pname, _ in items
        ]
        geo = math.exp(sum(math.log(r) for r in per) / len(per))
        acc = statistics.mean(accept[name]) if accept[name] else 0.0
        same = ("equal" if equal[name] else "DIFFERS") if configs[name][0] in ("specchat", "other") else ""
        tpp = statistics.mean(per_pass[name]) if per_pass[name] else 0.0
        rows.append(
            {"config": name, "tok_s": med[name], "vs_own_plain": ratio, "acceptance": acc, "output": same,
             "tokens_per_pass": tpp, "vs_own_plain_per_prompt": per, "vs_own_plain_geomean": geo}
        )  # fmt: skip
        print(f"  {name:36} {med[name]:7.2f} tok/s  {ratio:5.2f}x its plain (per prompt "
              f"{' / '.join(f'{r:.2f}' for r in per)}, geomean {geo:.2f}x)  accept {acc:4.0%}  "
              f"{tpp:4.2f} tok/pass  {same}")  # fmt: skip
    best_llama = max((r for r in rows if r["config"].startswith("llama-server")), key=lambda r: r["tok_s"])
    ours = med["specchat proxy default"]
    print(f"\nspecchat default through the proxy / llama-server's best ({best_llama['config']}): "
          f"{ours / best_llama['tok_s']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "args": vars(args) | {"bin_dir": str(args.bin_dir)}}, default=str)
        )


if __name__ == "__main__":
    main()
