"""llama.cpp's own server on the planted-pattern benchmark files (tests/perf/hybrid_models.py): plain
decoding, a draft model (draft-simple) and MTP drafting (draft-mtp: the NextN block of a Qwen3.5-layout
file, or a Gemma 4 assistant), one greedy request each, with the acceptance and speed the server reports.

Not a test (pytest does not collect it). Each configuration is its own llama-server process on
127.0.0.1 and a free port, stopped after its request; the request is a raw ChatML prompt of about 100
tokens, 128 tokens greedy, no prompt cache. Decode speed is the server's predicted_per_second
(prompt processing excluded); acceptance is draft_n_accepted / draft_n.

Usage:
  python tests/perf/hybrid_serve.py LLAMA_BIN_DIR [MODEL_DIR] [--only NAME,...] [-n 128] [--threads 2]
LLAMA_BIN_DIR holds llama-server (/work/shared/tools/build-llama-cpp.sh prints it); MODEL_DIR defaults
to ~/.cache/specchat-dev/hybrid.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "specchat-dev" / "hybrid"
PROMPT = (
    "<|im_start|>system\nYou are a helpful coding assistant. Answer with working code first, then a short "
    "explanation of how it works and what its edge cases are.<|im_end|>\n<|im_start|>user\nWrite a Python "
    "function that merges two sorted lists into one sorted list without calling sort(), with a docstring, "
    "type hints and a few doctest examples, and explain why it runs in linear time. Then show how to "
    "extend it to merge any number of sorted iterables lazily with a heap.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
DRAFT = ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
MTP = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "4"]
#: name -> (target file, extra llama-server arguments); files are relative to MODEL_DIR
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "qwen35-12x1024 plain": ("qwen35-12x1024-f16.gguf", []),
    "qwen35-12x1024 + qwen2 draft": ("qwen35-12x1024-f16.gguf", ["-md", "qwen2-2x512-f16.gguf", *DRAFT]),
    "qwen35-16x2048 plain": ("qwen35-16x2048-q8_0-mtp.gguf", []),
    "qwen35-16x2048 + NextN (draft-mtp)": ("qwen35-16x2048-q8_0-mtp.gguf", MTP),
    "lfm2-16x2048 plain": ("lfm2-16x2048-q8_0.gguf", []),
    "lfm2-16x2048 + lfm2 draft": ("lfm2-16x2048-q8_0.gguf", ["-md", "lfm2-16x1024-q8_0.gguf", *DRAFT]),
    "gemma4-12x1024 plain": ("gemma4-12x1024-f16.gguf", []),
    "gemma4-12x1024 + assistant (draft-mtp)": (
        "gemma4-12x1024-f16.gguf",
        ["-md", "gemma4-assistant-4x256-f16.gguf", *MTP],
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


def run(server: Path, model_dir: Path, target: str, extra: list[str], n: int, threads: int) -> dict:
    """One llama-server process, one request; its timings."""
    port = free_port()
    args = [str(model_dir / a) if a.endswith(".gguf") else a for a in extra]
    cmd = [str(server), "-m", str(model_dir / target), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-c", "2048", "-np", "1", *args]  # fmt: skip
    print("  $", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        body = {"prompt": PROMPT, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=1800) as r:
            return json.loads(r.read())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("model_dir", type=Path, nargs="?", default=DEFAULT_DIR)
    ap.add_argument("--only", help="comma-separated configuration names (default: all)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CONFIGS)
    for name in names:
        target, extra = CONFIGS[name]
        print(name, flush=True)
        res = run(args.bin_dir / "llama-server", args.model_dir, target, extra, args.n, args.threads)
        t = res["timings"]
        speed = t["predicted_per_second"]
        line = f"  prompt {t['prompt_n']} tokens, {t['predicted_n']} tokens at {speed:.2f} tok/s"
        if t.get("draft_n"):
            n_draft, n_ok = t["draft_n"], t["draft_n_accepted"]
            line += f", drafted {n_draft}, accepted {n_ok} ({n_ok / n_draft:.0%})"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
