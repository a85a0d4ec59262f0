"""A TCP proxy that adds a fixed delay each way, as a LAN or Wi-Fi link would, in front of an RPC worker.

Not a test (pytest does not collect it). Every chunk read from one side is written to the other
`delay` seconds after it arrived, in order, so a request/reply round trip costs 2 x delay more than
on loopback while bandwidth stays the machine's own; TCP_NODELAY on both legs, as ggml-rpc sets it.
Used by rpc_vs_llama.py; runs alone too:

  python tests/perf/latency_proxy.py --listen 50053 --to 127.0.0.1:50052 --delay-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + delay, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((loop.time() + delay, b""))

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                break
        writer.close()

    await asyncio.gather(receive(), send())


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _serve(listen: int, host: str, port: int, delay: float, ready: threading.Event) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(host, port)
        except OSError:
            c_writer.close()
            return
        _nodelay(c_writer)
        _nodelay(s_writer)
        await asyncio.gather(_pipe(c_reader, s_writer, delay), _pipe(s_reader, c_writer, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    ready.set()
    async with server:
        await server.serve_forever()


@contextmanager
def latency_proxy(listen: int, to: str, delay_ms: float) -> Iterator[str]:
    """Run the proxy on 127.0.0.1:`listen` (a daemon thread) for the with-block; yields its address."""
    host, _, port = to.rpartition(":")
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    task: list[asyncio.Task[None]] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        task.append(loop.create_task(_serve(listen, host, int(port), delay_ms / 1000, ready)))
        with suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])

    thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError(f"the proxy could not listen on 127.0.0.1:{listen}")
    try:
        yield f"127.0.0.1:{listen}"
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--to", required=True, help="HOST:PORT of the worker")
    ap.add_argument("--delay-ms", type=float, default=2.0)
    args = ap.parse_args()
    with latency_proxy(args.listen, args.to, args.delay_ms) as addr:
        print(f"proxy {addr} -> {args.to}, +{args.delay_ms} ms each way (Ctrl-C stops)", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
