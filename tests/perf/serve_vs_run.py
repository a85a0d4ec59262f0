"""Side by side, interleaved: tok/s through `specchat serve` against `serve --no-draft` and `specchat run`.

Not a test (pytest does not collect it): the measurement behind `serve` against `run` in
docs/performance.md. Every server is started first (one per drafter setting, each idle while another
answers), then each round sends one request to each server and runs `specchat run --json` with the
same settings, so a machine that speeds up or slows down between rounds moves every column alike.
Alongside tok/s it reads, from /proc, the voluntary context switches the server's threads made per
generated token: llama.cpp's OpenMP threads spin at barriers and sleep only when oversubscribed, so
a healthy server makes almost none (an oversubscribed one made ~250 a token).

Usage: python tests/perf/serve_vs_run.py TARGET DRAFT [PROMPT] [--tokens N] [--rounds R]
       [--configs no-draft,default,ngram,model]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
from local_server import free_port, start_server  # this folder (run as a script)

DEFAULT_PROMPT = "Write a Python class Stack with push, pop and peek."


def drafter_args(name: str, draft: str) -> list[str]:
    return {
        "no-draft": ["--no-draft"],
        "default": ["--draft", draft, "--draft", "ngram"],
        "ngram": ["--draft", "ngram"],
        "model": ["--draft", draft],
    }[name]


def switches(pid: int) -> int:
    """Voluntary context switches of all of the process's threads so far (Linux /proc)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            continue
    return total


def via_server(port: int, pid: int, prompt: str, n: int) -> tuple[float, float]:
    """(tok/s, voluntary context switches per generated token) for one request."""
    body = {
        "model": "x",
        "temperature": 0,
        "max_tokens": n,
        "messages": [{"role": "user", "content": prompt}],
    }
    before = switches(pid)
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=900).json()
    spec = reply["speculative"]
    return float(spec["tokens_per_second"]), (switches(pid) - before) / max(1, spec["generated_tokens"])


def via_run(target: str, args: list[str], prompt: str, n: int) -> float:
    cmd = [sys.executable, "-m", "specchat", "run", target, *args, "--temp", "0", "-n", str(n), "--json"]
    out = subprocess.run([*cmd, "-p", prompt], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["stats"]["tokens_per_second"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="no-draft,default,ngram,model")
    opts = ap.parse_args()
    names = opts.configs.split(",")
    servers = {}
    try:
        for name in names:
            port = free_port()
            servers[name] = (start_server(opts.target, drafter_args(name, opts.draft), port), port)
        served: dict[str, list[float]] = {name: [] for name in names}
        ran: dict[str, list[float]] = {name: [] for name in names}
        cs: dict[str, list[float]] = {name: [] for name in names}
        for r in range(opts.rounds):
            for name in names:
                proc, port = servers[name]
                tps, per_token = via_server(port, proc.pid, opts.prompt, opts.tokens)
                served[name].append(tps)
                cs[name].append(per_token)
                ran[name].append(
                    via_run(opts.target, drafter_args(name, opts.draft), opts.prompt, opts.tokens)
                )
                print(
                    f"round {r + 1} {name:9s} serve {tps:6.1f} tok/s ({per_token:5.1f} switches/token)"
                    f"   run {ran[name][-1]:6.1f} tok/s",
                    flush=True,
                )
        base = statistics.median(served[names[0]])
        print(f"\nmedians of {opts.rounds} rounds, {opts.tokens} tokens, greedy")
        ratio = "serve/" + names[0]
        print(f"{'config':9s} {'serve':>7s} {'run':>7s} {'serve/run':>10s} {ratio:>16s} switches/tok")
        for name in names:
            s, r = statistics.median(served[name]), statistics.median(ran[name])
            per = statistics.median(cs[name])
            print(f"{name:9s} {s:7.1f} {r:7.1f} {s / r:10.2f}x {s / base:15.2f}x {per:8.1f}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
