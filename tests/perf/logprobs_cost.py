"""What logprobs cost through `specchat serve`, interleaved: the same request with and without them.

Not a test (pytest does not collect it): the measurement behind the logprobs cost through `serve` in
docs/performance.md. One server per drafter setting is started first; each round sends every server
the same greedy request twice, without logprobs and with `logprobs: true, top_logprobs: N`, in
alternating order (ABBA), so a machine that speeds up or slows down moves both columns alike. For
each request it also reads, from /proc, the CPU seconds other processes used meanwhile, so rounds
disturbed by other load can be told apart ("quiet": under 0.5 s). It checks on the way that logprobs
change nothing in the answer, and that at temperature 0 the logprobs with drafting equal those of
the same server with `speculative: false`.

Usage: python tests/perf/logprobs_cost.py TARGET DRAFT [PROMPT] [--tokens N] [--rounds R] [--top N]
       [--configs default,model-k3]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import httpx
from local_server import free_port, start_server  # this folder (run as a script)

DEFAULT_PROMPT = (
    "Write a Python function that parses an ISO 8601 date string into a datetime, with a docstring."
)
QUIET = 0.5  # CPU seconds other processes may use during a request for it to count as quiet
TICK = os.sysconf("SC_CLK_TCK")


def drafter_args(name: str, draft: str) -> list[str]:
    return {
        "default": ["--draft", draft, "--draft", "ngram"],  # what `serve ALIAS` loads: auto k
        "model-k3": ["--draft", draft, "-k", "3"],  # the draft model decides most tokens
        "no-draft": ["--no-draft"],
    }[name]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, all threads


def busy_seconds() -> float:
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICK  # all but idle and iowait


def ask(port: int, prompt: str, n: int, **extra: object) -> dict:  # type: ignore[type-arg]
    body = {
        "model": "x",
        "temperature": 0,
        "max_tokens": n,
        "messages": [{"role": "user", "content": prompt}],
    }
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions", json={**body, **extra}, timeout=900
    ).json()


def measured(port: int, pid: int, prompt: str, n: int, **extra: object) -> tuple[float, float, str]:
    """(tok/s, CPU seconds other processes used meanwhile, the answer) for one request."""
    mine0, busy0, server0 = os.times(), busy_seconds(), cpu_seconds(pid)
    reply = ask(port, prompt, n, **extra)
    mine1 = os.times()
    own = (mine1.user + mine1.system) - (mine0.user + mine0.system) + cpu_seconds(pid) - server0
    other = busy_seconds() - busy0 - own
    return float(reply["speculative"]["tokens_per_second"]), other, reply["choices"][0]["message"]["content"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--configs", default="default,model-k3")
    opts = ap.parse_args()
    names = opts.configs.split(",")
    lp = {"logprobs": True, "top_logprobs": opts.top}
    servers = {}
    try:
        for name in names:
            port = free_port()
            servers[name] = (start_server(opts.target, drafter_args(name, opts.draft), port), port)
        for _proc, port in servers.values():
            ask(port, opts.prompt, opts.tokens)  # warm-up: prefill, the planner's first rounds
        rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
        for r in range(opts.rounds):
            for name in names:
                proc, port = servers[name]
                order = [False, True] if r % 2 == 0 else [True, False]
                got = {}
                for with_lp in order:
                    got[with_lp] = measured(
                        port, proc.pid, opts.prompt, opts.tokens, **(lp if with_lp else {})
                    )
                (tps0, other0, text0), (tps1, other1, text1) = got[False], got[True]
                assert text0 == text1, f"{name}: logprobs changed the answer"
                rows[name].append((tps0, tps1, other0, other1))
                print(
                    f"round {r + 1} {name:9s} plain {tps0:6.2f} tok/s (others {other0:5.2f} cpu-s)"
                    f"   logprobs {tps1:6.2f} tok/s (others {other1:5.2f} cpu-s)",
                    flush=True,
                )
        print(f"\nmedians, {opts.tokens} tokens, greedy, top_logprobs {opts.top}")
        print(
            f"{'config':9s} {'plain':>7s} {'logprobs':>9s} {'cost':>7s}   quiet rounds: plain logprobs cost"
        )
        for name in names:
            plain = statistics.median(x[0] for x in rows[name])
            with_lp = statistics.median(x[1] for x in rows[name])
            quiet = [x for x in rows[name] if x[2] < QUIET and x[3] < QUIET]
            line = f"{name:9s} {plain:7.2f} {with_lp:9.2f} {100 * (1 - with_lp / plain):6.1f}%"
            if quiet:
                qp, ql = statistics.median(x[0] for x in quiet), statistics.median(x[1] for x in quiet)
                line += f"   {len(quiet)}: {qp:7.2f} {ql:7.2f} {100 * (1 - ql / qp):6.1f}%"
            print(line)
        for name in names:  # the same logprobs with drafting on and off, temperature 0
            _, port = servers[name]
            on = ask(port, opts.prompt, opts.tokens, **lp)
            off = ask(port, opts.prompt, opts.tokens, **lp, speculative=False)
            a, b = on["choices"][0]["logprobs"]["content"], off["choices"][0]["logprobs"]["content"]
            same = [x["token"] for x in a] == [x["token"] for x in b]
            diff = max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b, strict=False))
            spec = on["speculative"]
            print(
                f"{name}: drafting on (accepted {spec['accepted']} of {spec['generated_tokens']}, k at most "
                f"{max(spec['k_history'])}) vs off: tokens {'equal' if same else 'DIFFER'}, "
                f"max |logprob difference| {diff:.2e}"
            )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
