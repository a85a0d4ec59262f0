"""CPU time per decoded token (and per verify-sized batch), one thread: onetoken_types.py's comparison
for a machine shared with other work, where wall-clock rates swing by 10x from run to run.

Not a test (pytest does not collect it). With one thread nothing waits at a barrier for a thread
that was descheduled, so the CPU time a decode takes hardly depends on what else runs; fixed costs
(loading, the prompt, start-up) cancel in a difference: per token (cpu at N+8 tokens - cpu at 8) / N,
per batch of k rows (cpu of 17 batches - cpu of 1) / 16. Configurations run interleaved (repeat 1 of
every one, then repeat 2, ...); medians are printed with each one's speed relative to the first.

  runs  (default) llama-server plain (its process's CPU across one /completion request) against
        `specchat run --no-draft -t 1` with this interpreter and, with --other-python PY, with PY
  bench (--bench) `llama-bench -t 1`: `tg` one token at a time, `ppK` batches of K rows, with the
        reference build's libraries and with each --lib NAME=DIR (a build's libggml*.so and
        libllama.so in front on LD_LIBRARY_PATH, e.g. a venv's site-packages/llama_cpp/lib)

Usage:
  python tests/perf/onetoken_cpu.py LLAMA_BIN_DIR [--types F16,BF16,Q8_0,Q4_K_M] [-n 128]
      [--repeats 3] [--other-python PY] [--bench [--tests tg,pp4,pp16] --lib new=DIR ...]
LLAMA_BIN_DIR is a stock build of the tree llama-cpp-python vendors (llama-server, llama-bench,
llama-quantize); the model files are onetoken_types.py's, written on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetoken_types import PROMPT, ROOT, free_port, model_files

HZ = os.sysconf("SC_CLK_TCK")
FIXED = 8  # tokens (or batches) every measurement also has: its difference cancels the fixed costs


def children_cpu(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """CPU seconds (user + system) a child command took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, capture_output=True, check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def process_cpu(pid: int) -> float:
    """CPU seconds a running process has used so far (/proc/PID/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def server_cost(bin_dir: Path, model: Path, n: int) -> float:
    """llama-server's CPU seconds per decoded token, one thread."""
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", str(model), "-t", "1", "-tb", "1", "-c", "2048"]
    cmd += ["--port", str(port), "--host", "127.0.0.1", "-np", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(base + "/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)

        def request(tokens: int) -> float:
            start = process_cpu(proc.pid)
            body = {
                "prompt": PROMPT,
                "n_predict": tokens,
                "temperature": 0,
                "top_k": 1,
                "cache_prompt": False,
            }
            req = urllib.request.Request(
                base + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=900) as r:
                got = json.load(r)["timings"]["predicted_n"]
            if got != tokens:
                raise SystemExit(f"llama-server decoded {got} tokens, not {tokens}")
            return process_cpu(proc.pid) - start

        request(FIXED)  # warm: the first request pays for the graph's first allocation
        return (request(n + FIXED) - request(FIXED)) / n
    finally:
        proc.terminate()
        proc.wait()


def specchat_cost(model: Path, n: int, python: str) -> float:
    """`specchat run --no-draft -t 1`'s CPU seconds per decoded token (this checkout's specchat)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def run(tokens: int) -> float:
        cmd = [python, "-m", "specchat", "run", str(model), "--no-draft", "--raw", "--temp", "0"]
        cmd += ["-n", str(tokens), "--json", "-t", "1", "-c", "2048", "-p", PROMPT]
        return children_cpu(cmd, env)

    return (run(n + FIXED) - run(FIXED)) / n


def bench_cost(bin_dir: Path, model: Path, n: int, test: str, lib: Path | None) -> float:
    """llama-bench's CPU seconds per token (`tg`) or per batch of K rows (`ppK`), one thread."""
    env = dict(os.environ)
    if lib is not None:
        env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", "1", "-o", "json"]
    if test == "tg":
        big = children_cpu([*cmd, "-p", "0", "-n", str(n + FIXED), "-r", "1"], env)
        return (big - children_cpu([*cmd, "-p", "0", "-n", str(FIXED), "-r", "1"], env)) / n
    rows = test.removeprefix("pp")
    big = children_cpu([*cmd, "-p", rows, "-n", "0", "-r", "17"], env)
    return (big - children_cpu([*cmd, "-p", rows, "-n", "0", "-r", "1"], env)) / 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("--types", default="F16,BF16,Q8_0,Q4_K_M")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache/specchat-dev/onetoken")
    ap.add_argument("--other-python", help="also specchat with this interpreter's llama-cpp-python build")
    ap.add_argument("--bench", action="store_true", help="llama-bench's kernels instead of the programs")
    ap.add_argument("--tests", default="tg", help="with --bench: tg and/or ppK, comma-separated")
    ap.add_argument("--lib", action="append", default=[], help="with --bench: NAME=DIR, repeatable")
    a = ap.parse_args()
    files = model_files(a.bin_dir, a.dir.expanduser(), a.types.split(","))
    configs: dict[str, Callable[[Path], float]] = {}
    if a.bench:
        libs: dict[str, Path | None] = {"stock": None}
        libs.update({name: Path(d) for name, _, d in (x.partition("=") for x in a.lib)})
        for test in a.tests.split(","):
            for name, lib in libs.items():
                configs[f"{test} {name}"] = (
                    lambda m, t=test, lib=lib: bench_cost(a.bin_dir, m, a.n, t, lib)  # type: ignore[misc]
                )
    else:
        configs["server"] = lambda m: server_cost(a.bin_dir, m, a.n)
        configs["specchat"] = lambda m: specchat_cost(m, a.n, sys.executable)
        if a.other_python:
            configs["specchat-other"] = lambda m: specchat_cost(m, a.n, a.other_python)
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.repeats):
        for ty, path in files.items():
            for name, fn in configs.items():
                res.setdefault((ty, name), []).append(fn(path))
    for ty in files:
        base: dict[str, float] = {}
        for name in configs:
            med = statistics.median(res[(ty, name)])
            group = name.split(" ")[0] if a.bench else ""
            ref = base.setdefault(group, med)
            print(f"{ty:7s} {name:16s} {1000 * med:8.2f} ms CPU  speed x{ref / med:.3f} of the first")


if __name__ == "__main__":
    main()
