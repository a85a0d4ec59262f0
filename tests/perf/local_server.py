"""`specchat serve` as a subprocess on 127.0.0.1, for the perf scripts that measure through the API
(serve_vs_run.py, logprobs_cost.py). Not a test; imported by those scripts from their own folder."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(target: str, args: list[str], port: int) -> subprocess.Popen[str]:
    """`specchat serve TARGET ARGS --port PORT`, returned once /health answers (exits if it dies)."""
    cmd = [sys.executable, "-m", "specchat", "serve", target, *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve {' '.join(args)} exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    sys.exit("a server did not start within 10 minutes")
