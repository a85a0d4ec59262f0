"""aider's one-shot edit through `specchat serve` against llama.cpp's llama-server, end to end.

Not a test (pytest does not collect it): the measurement behind issue 28. aider (the coding
assistant, `pip install aider-chat` in a venv of its own) is asked to rename a function and add type
hints in tests/perf/aider/inventory.py (50 lines), with the diff edit format, once per round on each
server, interleaved; every server is started first and idles while another works. Each run gets a
fresh copy of the file; the wall time is aider's whole process (its start-up is the same for all).

Usage: python tests/perf/aider_edit.py TARGET DRAFT AIDER_BIN [--llama-server BIN] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from local_server import free_port, start_server  # this folder (run as a script)
from serve_cache import start_llama_server

HERE = Path(__file__).resolve().parent
MESSAGE = "Rename calc_total to compute_total everywhere and add type hints to every function."


def run_aider(aider: str, port: int, workdir: Path) -> tuple[float, bool]:
    """(wall seconds, whether aider changed the file) for one aider run. (A 1.5B model does not always
    keep to aider's diff format; at temperature 0 every server writes the same answer, so the runs
    compare alike either way.)"""
    src = workdir / "inventory.py"
    shutil.copy(HERE / "aider" / "inventory.py", src)
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENAI_API_KEY": "none"}
    cmd = [
        aider, "--model", "openai/local", "--openai-api-base", f"http://127.0.0.1:{port}/v1",
        "--edit-format", "diff", "--message", MESSAGE, "--yes-always", "--no-git", "--no-check-update",
        "--analytics-disable", "--no-show-model-warnings", "--no-stream", "--no-pretty", "inventory.py",
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(
        cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800
    )
    wall = time.perf_counter() - t0
    return wall, src.read_text() != (HERE / "aider" / "inventory.py").read_text()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("aider")
    ap.add_argument("--llama-server")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default="default,no-draft,llama ngram-mod,llama plain")
    args = ap.parse_args()
    wanted = args.configs.split(",")
    servers: dict[str, tuple[int, subprocess.Popen[str]]] = {}
    specchat = {"default": ["--draft", args.draft, "--draft", "ngram"], "no-draft": ["--no-draft"]}
    llama = {"llama ngram-mod": ["--spec-type", "ngram-mod"], "llama plain": []}
    for name in wanted:
        port = free_port()
        if name in specchat:
            servers[name] = (port, start_server(args.target, [*specchat[name], "--ctx-size", "8192"], port))
        elif args.llama_server:
            servers[name] = (port, start_llama_server(args.llama_server, args.target, port, llama[name]))
    walls: dict[str, list[float]] = {name: [] for name in servers}
    edited: dict[str, list[bool]] = {name: [] for name in servers}
    try:
        for r in range(args.rounds):
            for name, (port, _) in servers.items():
                with tempfile.TemporaryDirectory(prefix="aider-edit-") as tmp:
                    wall, ok = run_aider(args.aider, port, Path(tmp))
                walls[name].append(wall)
                edited[name].append(ok)
                print(f"round {r + 1} {name}: {wall:.1f} s, file changed: {ok}", flush=True)
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    base = statistics.median(walls["default"]) if "default" in walls else None
    for name in servers:
        med = statistics.median(walls[name])
        rel = f", specchat default / this {base / med:.2f}x" if base else ""
        print(
            f"{name}: median {med:.1f} s over {args.rounds} (runs {walls[name]}){rel}; edited {edited[name]}"
        )


if __name__ == "__main__":
    main()
