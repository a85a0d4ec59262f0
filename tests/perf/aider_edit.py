"""aider's one-shot edit through `specchat serve` against llama.cpp's llama-server, end to end.

Not a test (pytest does not collect it): the measurement behind the aider figures in
docs/performance.md. aider (the coding assistant, `pip install aider-chat` in a venv of its own) is
asked to rename a function and add type hints in tests/perf/aider/inventory.py (50 lines), with the
diff edit format, once per round on each server, interleaved; every server is started first and
idles while another works. Each run gets a fresh copy of the file; the wall time is aider's whole
process (its start-up is the same for all). With --cold every run gets a server started for it
(nothing cached from the round before: the first edit of a session, which is what a user waits for),
started before aider's clock starts.

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


SPECCHAT = ("default", "no-draft")
LLAMA = {"llama ngram-mod": ["--spec-type", "ngram-mod"], "llama plain": []}


def start(name: str, args: argparse.Namespace) -> tuple[int, subprocess.Popen[str]]:
    """A server for one configuration, on a port of its own, once it answers."""
    port = free_port()
    if name in SPECCHAT:
        extra = ["--draft", args.draft, "--draft", "ngram"] if name == "default" else ["--no-draft"]
        return port, start_server(args.target, [*extra, "--ctx-size", "8192"], port)
    return port, start_llama_server(args.llama_server, args.target, port, LLAMA[name])


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("aider")
    ap.add_argument("--llama-server")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default="default,no-draft,llama ngram-mod,llama plain")
    ap.add_argument("--cold", action="store_true", help="a server started for every run")
    args = ap.parse_args()
    wanted = [n for n in args.configs.split(",") if n in SPECCHAT or args.llama_server]
    servers: dict[str, tuple[int, subprocess.Popen[str]]] = {}
    if not args.cold:
        servers = {name: start(name, args) for name in wanted}
    walls: dict[str, list[float]] = {name: [] for name in wanted}
    edited: dict[str, list[bool]] = {name: [] for name in wanted}
    try:
        for r in range(args.rounds):
            for name in wanted:
                port, proc = servers[name] if not args.cold else start(name, args)
                with tempfile.TemporaryDirectory(prefix="aider-edit-") as tmp:
                    wall, ok = run_aider(args.aider, port, Path(tmp))
                if args.cold:
                    stop(proc)
                walls[name].append(wall)
                edited[name].append(ok)
                print(f"round {r + 1} {name}: {wall:.1f} s, file changed: {ok}", flush=True)
    finally:
        for _, proc in servers.values():
            stop(proc)
    base = statistics.median(walls["default"]) if "default" in walls else None
    for name in wanted:
        med = statistics.median(walls[name])
        rel = f", specchat default / this {base / med:.2f}x" if base else ""
        print(
            f"{name}: median {med:.1f} s over {args.rounds} (runs {walls[name]}){rel}; edited {edited[name]}"
        )


if __name__ == "__main__":
    main()
