"""`specchat serve` as a subprocess on 127.0.0.1, for the perf scripts that measure through the API
(serve_vs_run.py, logprobs_cost.py). Not a test; imported by those scripts from their own folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(target: str, args: list[str], port: int) -> subprocess.Popen[str]:
    """`specchat serve TARGET ARGS --port PORT`, returned once /health answers (exits if it dies).

    Its log (a line per request: prefill, cached tokens, drafting) goes to a file, named on stdout,
    rather than a pipe nobody reads, which a long run would fill until the server blocked."""
    cmd = [sys.executable, "-m", "specchat", "serve", target, *args, "--port", str(port)]
    fd, log = tempfile.mkstemp(prefix=f"specchat-serve-{port}-", suffix=".log")
    with os.fdopen(fd, "w") as sink:
        proc = subprocess.Popen(cmd, stderr=sink, stdout=subprocess.DEVNULL, text=True)
    print(f"serve {' '.join(args)}: log in {log}", flush=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log) as text:
                sys.exit(f"serve {' '.join(args)} exited: {text.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    sys.exit("a server did not start within 10 minutes")
