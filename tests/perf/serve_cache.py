"""Two conversations alternated through a server, as an agent and its sub-agent do: turns A, B,
A + follow-up, B + follow-up, each ~1,100 prompt tokens and a short answer; cached / prompt tokens and
wall time of each turn, for `specchat serve` (with and without drafting) and llama.cpp's llama-server.

Not a test (pytest does not collect it): the measurement behind the alternated conversations in
docs/performance.md. Every server is started first; each round then runs the four turns on each
server in turn, with a conversation pair of its own (so turn A is never cached), so a machine that
speeds up or slows down between rounds moves every column alike. The texts of the specchat servers'
answers are compared (drafting must write what the target alone writes, cache hits included).

Usage: python tests/perf/serve_cache.py TARGET DRAFT [--llama-server BIN] [--rounds R] [--tokens N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from local_server import free_port, start_server  # this folder (run as a script)

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a senior Python reviewer. Answer briefly and precisely."


def source_text(index: int, tokens: int = 1050) -> str:
    """About `tokens` tokens of this repository's own code, a different stretch for each index."""
    files = sorted((ROOT / "specchat").rglob("*.py"))
    text = "\n".join(f.read_text() for f in files)
    chars = tokens * 4  # ~4 characters a token for Python source in Qwen's tokenizer
    start = (index * 7919 * 13) % max(1, len(text) - chars)
    return text[start : start + chars]


def conversation(index: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": "Here is some code:\n\n```python\n" + source_text(index) + "\n```\n\nWhat does it do?",
        },
    ]


def ask(port: int, messages: list[dict[str, str]], n: int) -> tuple[int, int, float, str]:
    """(cached, prompt tokens, wall seconds, text) of one non-streamed chat request."""
    body = {"model": "x", "messages": messages, "max_tokens": n, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=900)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    data = r.json()
    usage = data["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return int(cached), int(usage["prompt_tokens"]), wall, data["choices"][0]["message"]["content"]


def four_turns(port: int, pair: int, n: int) -> list[tuple[int, int, float, str]]:
    a, b = conversation(2 * pair), conversation(2 * pair + 1)
    out = []
    ra = ask(port, a, n)
    rb = ask(port, b, n)
    out += [ra, rb]
    a2 = [*a, {"role": "assistant", "content": ra[3]}, {"role": "user", "content": "Is there a bug in it?"}]
    b2 = [*b, {"role": "assistant", "content": rb[3]}, {"role": "user", "content": "How would you test it?"}]
    out.append(ask(port, a2, n))
    out.append(ask(port, b2, n))
    return out


def start_llama_server(
    binary: str, target: str, port: int, extra: list[str] | None = None
) -> subprocess.Popen[str]:
    """llama-server as this measurement runs it (`--jinja -np 1 -c 8192 -fa on`, its defaults otherwise)."""
    cmd = [binary, "-m", target, "--jinja", "-np", "1", "-c", "8192", "-fa", "on", "--port", str(port)]
    cmd += extra or []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("llama-server exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument(
        "--llama-server", help="llama.cpp's llama-server binary (built from the vendored llama.cpp)"
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=8192)
    args = ap.parse_args()
    servers: dict[str, tuple[int, subprocess.Popen[str]]] = {}
    ctx = ["--ctx-size", str(args.ctx)]
    for name, extra in (
        ("specchat default", ["--draft", args.draft, "--draft", "ngram"]),
        ("specchat --no-draft", ["--no-draft"]),
    ):
        port = free_port()
        servers[name] = (port, start_server(args.target, [*extra, *ctx], port))
    if args.llama_server:
        port = free_port()
        servers["llama-server"] = (port, start_llama_server(args.llama_server, args.target, port))
    results: dict[str, list[list[tuple[int, int, float, str]]]] = {name: [] for name in servers}
    try:
        for r in range(args.rounds):
            for name, (port, _) in servers.items():
                results[name].append(four_turns(port, r, args.tokens))
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    labels = ["A", "B", "A + follow-up", "B + follow-up"]
    print(f"{args.rounds} rounds, {args.tokens} tokens an answer; cached / prompt, median wall seconds")
    print("| turn | " + " | ".join(servers) + " |")
    print("|---|" + "---|" * len(servers))
    for i, label in enumerate(labels):
        cells = []
        for name in servers:
            runs = [rnd[i] for rnd in results[name]]
            cells.append(f"{runs[0][0]} / {runs[0][1]}, {statistics.median(x[2] for x in runs):.2f} s")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if "llama-server" in servers:
        for name in servers:
            if name == "llama-server":
                continue
            ratios = [
                statistics.median(rnd[i][2] for rnd in results[name])
                / statistics.median(rnd[i][2] for rnd in results["llama-server"])
                for i in (2, 3)
            ]
            print(f"{name} / llama-server wall, follow-ups: " + ", ".join(f"{x:.2f}x" for x in ratios))
    same = [t[3] for rnd in results["specchat default"] for t in rnd] == [
        t[3] for rnd in results["specchat --no-draft"] for t in rnd
    ]
    print(f"specchat default writes what --no-draft writes: {same}")


if __name__ == "__main__":
    main()
