"""Talking to a llama.cpp RPC worker from Python: the endpoint list `--rpc` takes, and a probe that
asks a worker for its protocol version and its devices' memory before llama.cpp is let near it.

Why a probe of our own: llama.cpp's RPC client (ggml-rpc.cpp) ends the whole process with GGML_ABORT
when a worker cannot be reached, refuses the handshake or speaks another protocol version. So every
worker named by `--rpc` is first asked here, over a plain socket with a timeout, the three questions
llama.cpp itself asks (HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY); only when they are answered does the
load go on. A failure is one line naming the worker (`WorkerError`).

The wire format, from the vendored ggml/src/ggml-rpc/ggml-rpc.cpp (protocol 7.x, little-endian):
a request is | command (1 byte) | size (8 bytes) | payload |, a reply | size (8 bytes) | payload |.
HELLO (command 14, never renumbered) carries 24 bytes of transport capabilities (zeros: plain TCP) and
is answered by major, minor, patch, one byte of padding and the server's 24 capability bytes. A worker
serves one client at a time: while another process is using it, the connection is accepted but HELLO
is not answered, which the probe reports as busy when its timeout passes.

Standard library only, and no llama_cpp: `doctor` and the tests can ask a worker without loading
llama.cpp.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from ..errors import BadInput, WorkerError

#: the protocol major version this build's llama.cpp speaks (ggml-rpc.h RPC_PROTO_MAJOR_VERSION); a
#: worker of another major version is refused by llama.cpp with an abort, so it is refused here first
PROTO_MAJOR = 7
#: the highest minor version this build's client accepts (ggml-rpc.h RPC_PROTO_MINOR_VERSION)
PROTO_MINOR = 0
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
#: bytes of transport capabilities in HELLO (transport.h RPC_CONN_CAPS_SIZE)
CAPS_SIZE = 24
#: seconds a probe waits for a connection and for each reply
PROBE_TIMEOUT = 5.0
#: the port `ggml-rpc-server` and `specchat worker` listen on unless told otherwise
DEFAULT_PORT = 50052


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One worker's address, as llama.cpp's RPC client takes it (`HOST:PORT`)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker answered: its protocol version and each device's (free, total) memory in bytes."""

    endpoint: Endpoint
    version: tuple[int, int, int]
    memory: tuple[tuple[int, int], ...]

    @property
    def free_bytes(self) -> int:
        return sum(free for free, _ in self.memory)

    @property
    def total_bytes(self) -> int:
        return sum(total for _, total in self.memory)

    def line(self) -> str:
        """`127.0.0.1:50052: 1 device, 15,890 of 31,780 MiB free (RPC 7.0.0)`."""
        n = len(self.memory)
        return (
            f"{self.endpoint}: {n} device{'s' if n != 1 else ''}, {self.free_bytes >> 20:,} of "
            f"{self.total_bytes >> 20:,} MiB free (RPC {'.'.join(map(str, self.version))})"
        )


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """`--rpc HOST:PORT[,HOST:PORT...]` as given, checked: one line (BadInput) naming a bad entry.

    llama.cpp splits an endpoint at its first colon and would abort on a bad port, so an IPv6 literal or
    a missing port is refused here. A worker named twice is used once."""
    out: list[Endpoint] = []
    for raw in text.split(","):
        item = raw.strip()
        host, sep, port = item.partition(":")
        if not item or not sep or not host or ":" in port or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadInput(
                f"--rpc takes HOST:PORT[,HOST:PORT...] (got {item or text!r})",
                f"e.g. --rpc 127.0.0.1:{DEFAULT_PORT},192.168.1.20:{DEFAULT_PORT}",
            )
        out.append(Endpoint(host, int(port)))
    return tuple(dict.fromkeys(out))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return bytes(data)


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    """One request and its reply, whose size must be what the protocol says."""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ValueError(f"a reply of {size} bytes where {reply_size} were expected")
    return _recv_exact(sock, size)


def probe(endpoint: Endpoint, *, timeout: float = PROBE_TIMEOUT, build_tag: int | None = None) -> WorkerInfo:
    """Ask a worker its version and devices; `WorkerError` with one line when it cannot be used.

    `build_tag`: this build's tag (rpc.build_tag), which a `specchat worker` of the same build answers
    HELLO with as its patch version; a worker answering another one runs another build (another
    specchat, another patch queue, or llama.cpp's own ggml-rpc-server) and is refused. None: not
    compared."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise WorkerError(
            f"the RPC worker {endpoint} cannot be reached: {reason}",
            f"start it there with `specchat worker --host ADDR --port {endpoint.port}`, or leave it out "
            "of --rpc",
        ) from None
    with sock:
        try:
            hello = _call(sock, CMD_HELLO, bytes(CAPS_SIZE), 4 + CAPS_SIZE)
            version = (hello[0], hello[1], hello[2])
            if version[0] != PROTO_MAJOR or version[1] > PROTO_MINOR:
                raise WorkerError(
                    f"the RPC worker {endpoint} speaks RPC protocol {'.'.join(map(str, version))}, this "
                    f"build speaks {PROTO_MAJOR}.{PROTO_MINOR}",
                    "run `specchat worker` from the same specchat and llama.cpp build on both machines",
                )
            if build_tag is not None and version[2] != build_tag:
                raise WorkerError(
                    f"the RPC worker {endpoint} runs another llama.cpp build than this one (its tag "
                    f"{version[2]}, here {build_tag}), so the layers it computes would not round as "
                    "this build's do",
                    "run `specchat worker` there from the same specchat, installed with `make install` "
                    "(or give --force to use it anyway)",
                )
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            memory = tuple(
                struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                for i in range(count)
            )
        except TimeoutError:
            raise WorkerError(
                f"the RPC worker {endpoint} accepted the connection but did not answer within "
                f"{timeout:.0f} s",
                "a worker serves one client at a time: is another specchat or llama.cpp using it?",
            ) from None
        except (OSError, ValueError, struct.error) as exc:
            raise WorkerError(
                f"the RPC worker {endpoint} did not answer as a llama.cpp RPC server: {exc}",
                "check the address: is `specchat worker` (or ggml-rpc-server) listening there?",
            ) from None
    if not memory:
        raise WorkerError(f"the RPC worker {endpoint} offers no device", "start it with a --device it has")
    return WorkerInfo(endpoint, version, memory)
