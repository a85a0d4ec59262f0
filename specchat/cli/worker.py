"""`specchat worker`: serve this machine's device (CPU or GPU) to another machine's `--rpc`, with
llama.cpp's RPC server from specchat's own patched build.

Why from this build and not llama.cpp's `ggml-rpc-server`: layers computed on a worker must round
as they would on the machine that sends them, and only the patched kernels make a verify batch round
like one-token decoding. Loopback by default; another address only when `--host` asks for it, with
llama.cpp's warning, since whoever reaches the port can use the machine (no authentication).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated

import typer
from rich.markup import escape

from .common import check_range, err_console, guarded, out_console


def register(app: typer.Typer) -> None:
    """Add `worker` to the app (called by cli/__init__.py)."""
    app.command("worker")(worker)


@guarded
def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on. Anything but 127.0.0.1 lets other machines use this one: "
            "the RPC protocol has no authentication, so only on a network you trust.",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on.")] = 50052,
    device: Annotated[
        list[str] | None,
        typer.Option(
            "--device",
            help="Device(s) to serve, by llama.cpp's name (CPU, CUDA0, Metal, ...); repeat or separate "
            "with commas. Default: every GPU, else the CPU.",
        ),
    ] = None,
    mem: Annotated[
        int | None,
        typer.Option(
            "--mem",
            help="MiB of memory to lend per device: what the worker reports, and what the other "
            "machine places layers by (default: what the device reports; a CPU reports all its RAM).",
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", help="CPU threads (default: physical cores).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Tracebacks on errors.")] = False,
) -> None:
    """Serve this machine's device to a target split over several computers (`--rpc HOST:PORT`).

    Examples:

      specchat worker                               # 127.0.0.1:50052, for a test on one machine

      specchat worker --host 192.168.1.20           # on the desktop; then on the laptop:
      specchat run llama3-70b --rpc 192.168.1.20:50052

    Ctrl-C stops it.
    """
    from ..llama import worker as rpc_worker
    from ..llama.rpc_wire import PROTO_MAJOR, PROTO_MINOR, Endpoint
    from ..models.hardware import physical_cores

    check_range("--port", port, 1, 65535)
    check_range("--threads", threads, 1)
    check_range("--mem", mem, 1)
    names = [n.strip() for given in device or () for n in given.split(",") if n.strip()]
    endpoint = Endpoint(host, port)
    devices = rpc_worker.limit_memory(rpc_worker.choose_devices(names), mem)
    rpc_worker.tag_build()  # clients of this build know it by this tag (llama/rpc.py build_tag)
    rpc_worker.check_address(endpoint)
    out, err = out_console(), err_console()
    if not rpc_worker.is_loopback(host):
        warning = rpc_worker.EXPOSED_WARNING.format(endpoint=endpoint)
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    n_threads = threads or physical_cores()
    out.print(
        f"specchat worker on [bold]{escape(str(endpoint))}[/] (llama.cpp RPC {PROTO_MAJOR}.{PROTO_MINOR}, "
        f"{n_threads} thread{'s' if n_threads != 1 else ''}) serving:",
        soft_wrap=True,
    )
    for d in devices:
        out.print(f"  {escape(d.line())}", soft_wrap=True)
    out.print(
        f"use it with: specchat run MODEL --rpc {escape(str(endpoint))}   (Ctrl-C stops the worker)",
        soft_wrap=True,
    )
    sys.stdout.flush()
    # Ctrl-C (SIGINT) stops the worker however it was started, as it stops `specchat serve`: a shell's
    # background job (`specchat worker &` in a script) inherits SIGINT ignored, and Python then leaves
    # it ignored, so `kill -INT` did nothing
    signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = rpc_worker.start(endpoint, devices, n_threads)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        err.print("worker stopped")
        _leave(0)
    err.print(
        f"[bold red]error:[/] the RPC server on {escape(str(endpoint))} stopped (see its message above)"
    )
    _leave(1)


def _leave(code: int) -> None:
    """End the process at once: the RPC server has no stop call, and its thread is inside llama.cpp
    (in accept() or serving a client), where an orderly interpreter exit could run llama.cpp's static
    destructors under it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
