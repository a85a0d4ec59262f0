"""`specchat worker` for the tests: started as a child process on a free port of 127.0.0.1 and waited
for until it answers the probe, stopped with Ctrl-C (test_rpc_split.py, test_rpc_faults.py); a relay
in front of one that counts the bytes each way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest

from specchat.errors import WorkerError
from specchat.llama.rpc_wire import Endpoint, probe

NO_RPC = "this llama-cpp-python has no RPC backend (`make install` builds it with GGML_RPC=ON)"


def rpc_build() -> bool:
    """Whether the installed llama.cpp has ggml-rpc."""
    from specchat.llama.rpc import rpc_supported

    return rpc_supported()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """The test's private homes (conftest) for the children too, and no colour."""
    return {**os.environ, "NO_COLOR": "1"}


@contextmanager
def started_worker(
    *extra: str, port: int | None = None, sigint_ignored: bool = False
) -> Iterator[tuple[Endpoint, subprocess.Popen[str]]]:
    """`specchat worker` (with `extra` options) on `port` (default: a free one), answering the probe;
    stopped with Ctrl-C unless a test ended it itself. `sigint_ignored`: started as a shell's
    background job starts it, with SIGINT ignored."""
    port = port or free_port()
    argv = [sys.executable, "-m", "specchat", "worker", "--port", str(port), "--threads", "1", *extra]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), preexec_fn=ignore
    )
    endpoint = Endpoint("127.0.0.1", port)
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                said = proc.stdout.read() if proc.stdout else ""
                pytest.fail(f"the worker exited {proc.returncode}: {said}")
            try:
                probe(endpoint, timeout=5)
                break
            except WorkerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Relay:
    """A TCP relay in front of a worker that counts the bytes each way (`counting_relay`)."""

    def __init__(self, to: Endpoint) -> None:
        self.to = to
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self.server.getsockname()[1])
        self.to_worker = 0
        self.from_worker = 0
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []

    def _pipe(self, src: socket.socket, dst: socket.socket, from_worker: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                with self._lock:
                    if from_worker:
                        self.from_worker += len(data)
                    else:
                        self.to_worker += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            worker = socket.create_connection((self.to.host, self.to.port))
            for s in (client, worker):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as ggml-rpc sets it
            self._socks += [client, worker]
            for args in ((client, worker, False), (worker, client, True)):
                threading.Thread(target=self._pipe, args=args, daemon=True).start()

    def close(self) -> None:
        self.server.close()
        for s in self._socks:
            with suppress(OSError):
                s.close()


@contextmanager
def counting_relay(to: Endpoint) -> Iterator[Relay]:
    """A relay on a free port of 127.0.0.1 to the worker at `to`, counting what crosses it: a split's
    clients connect to `relay.endpoint`; `relay.from_worker` is what the worker sent back."""
    relay = Relay(to)
    threading.Thread(target=relay.serve, daemon=True).start()
    try:
        yield relay
    finally:
        relay.close()
