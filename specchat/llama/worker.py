"""`specchat worker`'s engine: llama.cpp's RPC server (ggml-rpc's `ggml_backend_rpc_start_server`) run
from this process, on this build, so a worker computes every row with the same patched kernels as the
machine that sends it layers (a stock `ggml-rpc-server` would round verify batches its own way).

The server is what llama.cpp's tools/rpc/rpc-server.cpp runs, with its choices: the devices named, else
every accelerator, else the CPU; its warning when the address is not the loopback one (the protocol
has no authentication: whoever reaches the port can run graphs and read and write the worker's
memory). `start_server` never returns while it serves, so it runs on a thread of its own and the caller
waits for Ctrl-C (the CLI then ends the process: the server has no stop call).
"""

from __future__ import annotations

import ctypes
import signal
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BadInput
from .devices import ggml_lib
from .lib import llama_cpp
from .rpc import require_rpc
from .rpc_wire import Endpoint

#: llama.cpp's own warning (tools/rpc/rpc-server.cpp) for a server on another address than 127.0.0.1
EXPOSED_WARNING = (
    "Never expose the RPC server to an open network! This is an experimental feature and is not "
    "secure: the RPC protocol has no authentication, and whoever reaches {endpoint} can run "
    "computations on this machine and read and write the memory it serves."
)


@dataclass(frozen=True, slots=True)
class WorkerDevice:
    """A device the worker serves: its ggml handle, name (CPU, CUDA0, ...) and memory in bytes."""

    handle: int
    name: str
    description: str
    free_bytes: int
    total_bytes: int

    def line(self) -> str:
        return (
            f"{self.name} ({self.description}): {self.free_bytes >> 20:,} MiB free of "
            f"{self.total_bytes >> 20:,} MiB"
        )


def _describe(lib: ctypes.CDLL, dev: int) -> WorkerDevice:
    name, desc, mem = lib.ggml_backend_dev_name, lib.ggml_backend_dev_description, lib.ggml_backend_dev_memory
    for fn in (name, desc):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    mem.restype, mem.argtypes = None, [ctypes.c_void_p, size_p, size_p]
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    mem(dev, ctypes.byref(free), ctypes.byref(total))
    return WorkerDevice(
        dev,
        (name(dev) or b"").decode(errors="replace"),
        (desc(dev) or b"").decode(errors="replace"),
        int(free.value),
        int(total.value),
    )


def all_devices(lib: ctypes.CDLL) -> list[WorkerDevice]:
    """Every device of this build's device list (RPC devices are never in it: see rpc.py)."""
    n, get = lib.ggml_backend_dev_count, lib.ggml_backend_dev_get
    n.restype, n.argtypes = ctypes.c_size_t, []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    llama_cpp.llama_backend_init()
    return [_describe(lib, get(i)) for i in range(int(n())) if get(i)]


def choose_devices(names: Sequence[str] = ()) -> list[WorkerDevice]:
    """The devices to serve: those named (one line listing the others when a name is unknown), else
    every accelerator (GPU, integrated GPU), else the CPU, as ggml-rpc-server chooses."""
    lib = require_rpc("specchat worker")
    devices = all_devices(lib)
    if names:
        by_name = {d.name.lower(): d for d in devices}
        unknown = [n for n in names if n.lower() not in by_name]
        if unknown:
            known = ", ".join(d.name for d in devices) or "none"
            raise BadInput(f"no device {unknown[0]!r} in this llama.cpp build", f"it has: {known}")
        return [by_name[n.lower()] for n in dict.fromkeys(names)]
    kind = lib.ggml_backend_dev_type
    kind.restype, kind.argtypes = ctypes.c_int, [ctypes.c_void_p]
    gpus = [d for d in devices if kind(d.handle) in (1, 2)]
    cpus = [d for d in devices if kind(d.handle) == 0]
    return gpus or cpus[:1]


def check_address(endpoint: Endpoint) -> None:
    """One line when the address cannot be listened on (in use, not this machine's), before the
    server itself would print a bare "Failed to create server socket" and return."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise BadInput(f"--host {endpoint.host}: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml-rpc's own server socket
        try:
            sock.bind(addr)
        except OSError as exc:
            raise BadInput(
                f"cannot listen on {endpoint}: {exc.strerror or exc}",
                "is another worker running there? pick another --port",
            ) from None


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost") or host.startswith("127.")


def limit_memory(devices: Sequence[WorkerDevice], mib: int | None) -> list[WorkerDevice]:
    """Cap the memory the server will report for each device at `mib` MiB (`--mem`): the figure a
    client places layers by (a CPU reports all of its RAM as free). Through
    ggml_backend_rpc_set_server_memory_limit (patch 0007 in patches/llama.cpp); one line on a build
    without it. Returns the devices as the server will report them."""
    if mib is None:
        return list(devices)
    lib = require_rpc("specchat worker --mem")
    fn = getattr(lib, "ggml_backend_rpc_set_server_memory_limit", None)
    if fn is None:
        raise BadInput(
            "--mem needs specchat's patch 0007 in the llama.cpp build, which this one lacks",
            "`make install` rebuilds it with the checkout's patch queue",
        )
    fn.restype, fn.argtypes = None, [ctypes.c_size_t]
    limit = mib << 20
    fn(limit)
    return [
        WorkerDevice(d.handle, d.name, d.description, min(d.free_bytes, limit), min(d.total_bytes, limit))
        for d in devices
    ]


def tag_build() -> int | None:
    """Answer HELLO with this build's tag as the protocol's patch version (rpc.build_tag), so a client of
    the same build knows the worker computes as it does; nothing on a build that cannot tag."""
    from .rpc import build_tag

    tag = build_tag()
    lib = ggml_lib()
    if tag is None or lib is None:
        return None
    fn = lib.ggml_backend_rpc_set_server_build_tag
    fn.restype, fn.argtypes = None, [ctypes.c_uint8]
    fn(tag)
    return tag


def start(endpoint: Endpoint, devices: Sequence[WorkerDevice], threads: int) -> threading.Thread:
    """Start serving `devices` on `endpoint` on a daemon thread (the call blocks for as long as it
    serves; ctypes releases the GIL meanwhile). The thread ends only if the server could not start."""
    lib = ggml_lib()
    assert lib is not None  # choose_devices required it
    fn = lib.ggml_backend_rpc_start_server
    fn.restype = None
    dev_array = ctypes.POINTER(ctypes.c_void_p)
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, dev_array]
    # the device array lives in `args`, which the thread holds for as long as the server may read it
    handles = (ctypes.c_void_p * len(devices))(*(d.handle for d in devices))
    args = (str(endpoint).encode(), None, threads, len(devices), handles)

    def serve() -> None:
        # Ctrl-C is the main thread's to take: delivered here it would break the server's accept()
        # and look like a server that stopped on its own
        if hasattr(signal, "pthread_sigmask"):  # (POSIX; Windows sends Ctrl-C to the main thread)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        fn(*args)

    thread = threading.Thread(target=serve, name=f"rpc-server {endpoint}", daemon=True)
    thread.start()
    return thread
