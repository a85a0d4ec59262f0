"""The `--rpc` endpoint list and the probe that asks a worker its version and memory before llama.cpp
(which aborts the process on a worker it cannot use) is let near it; the split's arithmetic.

Fake workers here: a thread on 127.0.0.1 that speaks (or garbles) llama.cpp's RPC protocol, no build
needed. The real worker and a real split are in test_rpc_split.py."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from specchat.errors import BadInput, WorkerError
from specchat.llama.rpc import keeps_output_local, plan
from specchat.llama.rpc_wire import (
    CAPS_SIZE,
    CMD_DEVICE_COUNT,
    CMD_GET_DEVICE_MEMORY,
    CMD_HELLO,
    Endpoint,
    WorkerInfo,
    parse_endpoints,
    probe,
)

GIB = 1 << 30


def _recv(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError
        data += chunk
    return data


def rpc_worker(version=(7, 0, 0), memory=((8 * GIB, 16 * GIB),)) -> Callable[[socket.socket], None]:
    """A client handler that answers as ggml-rpc's server does."""

    def serve(conn: socket.socket) -> None:
        while True:
            cmd, size = struct.unpack("<BQ", _recv(conn, 9))
            payload = _recv(conn, size)
            if cmd == CMD_HELLO:
                assert size == CAPS_SIZE
                reply = bytes([*version, 0]) + bytes(CAPS_SIZE)
            elif cmd == CMD_DEVICE_COUNT:
                reply = struct.pack("<I", len(memory))
            elif cmd == CMD_GET_DEVICE_MEMORY:
                (i,) = struct.unpack("<I", payload)
                reply = struct.pack("<QQ", *memory[i])
            else:
                return
            conn.sendall(struct.pack("<Q", len(reply)) + reply)

    return serve


@contextmanager
def fake_worker(handler: Callable[[socket.socket], None]) -> Iterator[Endpoint]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, suppress(ConnectionError, OSError):
                handler(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield Endpoint("127.0.0.1", server.getsockname()[1])
    finally:
        stop.set()
        server.close()


def test_endpoints_are_host_colon_port_each_once():
    assert parse_endpoints("127.0.0.1:50052, 10.0.0.2:6000,127.0.0.1:50052") == (
        Endpoint("127.0.0.1", 50052),
        Endpoint("10.0.0.2", 6000),
    )
    assert str(parse_endpoints("desk.lan:1")[0]) == "desk.lan:1"


@pytest.mark.parametrize(
    "bad", ["", "127.0.0.1", "127.0.0.1:", ":50052", "h:0", "h:70000", "h:x", "::1:5", "a:1,"]
)
def test_a_bad_endpoint_is_one_line_naming_it(bad):
    with pytest.raises(BadInput, match="--rpc takes HOST:PORT"):
        parse_endpoints(bad)


def test_a_worker_answers_its_version_and_each_devices_memory():
    with fake_worker(rpc_worker(memory=((8 * GIB, 16 * GIB), (2 * GIB, 4 * GIB)))) as ep:
        info = probe(ep, timeout=5)
    assert info.version == (7, 0, 0)
    assert info.memory == ((8 * GIB, 16 * GIB), (2 * GIB, 4 * GIB))
    assert info.free_bytes == 10 * GIB and info.total_bytes == 20 * GIB
    assert info.line() == f"{ep}: 2 devices, 10,240 of 20,480 MiB free (RPC 7.0.0)"


def test_nobody_listening_is_one_line_naming_the_worker():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(WorkerError, match=rf"the RPC worker 127.0.0.1:{port} cannot be reached") as caught:
        probe(Endpoint("127.0.0.1", port), timeout=2)
    assert "specchat worker" in (caught.value.hint or "")


def test_a_worker_of_another_protocol_version_is_refused_before_llama_cpp_aborts_on_it():
    with (
        fake_worker(rpc_worker(version=(3, 0, 0))) as ep,
        pytest.raises(WorkerError, match=r"protocol 3\.0\.0"),
    ):
        probe(ep, timeout=5)
    with (
        fake_worker(rpc_worker(version=(7, 1, 0))) as ep,
        pytest.raises(WorkerError, match=r"protocol 7\.1\.0"),
    ):
        probe(ep, timeout=5)


def test_a_worker_of_another_build_is_told_by_its_tag_when_one_is_expected():
    with fake_worker(rpc_worker(version=(7, 0, 42))) as ep:
        assert probe(ep, timeout=5, build_tag=42).version == (7, 0, 42)
        assert probe(ep, timeout=5).version == (7, 0, 42)  # not compared
    with (
        fake_worker(rpc_worker(version=(7, 0, 0))) as ep,  # llama.cpp's own ggml-rpc-server
        pytest.raises(WorkerError, match=r"another llama.cpp build than this one \(its tag 0, here 42\)"),
    ):
        probe(ep, timeout=5, build_tag=42)


def test_a_worker_busy_with_another_client_is_named_when_the_timeout_passes():
    def silent(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        threading.Event().wait(3)

    with fake_worker(silent) as ep, pytest.raises(WorkerError, match="did not answer within 1 s") as caught:
        probe(ep, timeout=1)
    assert "one client at a time" in (caught.value.hint or "")


def test_something_else_on_the_port_is_not_taken_for_a_worker():
    def http(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    with (
        fake_worker(http) as ep,
        pytest.raises(WorkerError, match=r"did not answer as a llama\.cpp RPC server"),
    ):
        probe(ep, timeout=5)


def _info(port: int, free: int) -> WorkerInfo:
    return WorkerInfo(Endpoint("127.0.0.1", port), (7, 0, 0), ((free, free),))


def test_a_cpu_machine_keeps_its_memorys_share_of_the_layers_and_the_workers_the_rest():
    one = [_info(1, 16 * GIB)]
    assert plan(2, one, local_free=16 * GIB) == (
        2,
        "layer 0 and the output on this machine, layer 1 on 127.0.0.1:1",
    )
    assert plan(80, one, local_free=48 * GIB)[0] == 81 - 60  # 3/4 of the memory: 60 layers stay here
    # always at least one layer on the workers, and at most all of them
    assert plan(4, one, local_free=1 << 60)[0] == 2
    assert plan(4, [_info(1, 1 << 60)], local_free=1)[0] == 5
    assert plan(4, [_info(1, 8), _info(2, 8)], local_free=16)[1].endswith("on 127.0.0.1:1, 127.0.0.1:2")


def test_gpu_layers_wins_and_local_gpus_share_every_layer_by_free_memory():
    one = [_info(1, GIB)]
    assert plan(10, one, local_free=GIB, gpu_layers=3)[0] == 3
    assert plan(10, one, local_free=GIB, gpu_layers=99) == (
        11,
        "the output layer on this machine, layers 0-9 on 127.0.0.1:1",
    )
    assert (
        plan(10, one, local_free=GIB, gpu_layers=1)[1]
        == "layers 0-9 on this machine, the output layer on 127.0.0.1:1"
    )
    assert (
        plan(10, one, local_free=GIB, gpu_layers=0)[1] == "every layer on this machine, none on 127.0.0.1:1"
    )
    offloaded, summary = plan(10, one, local_free=GIB, local_gpus=1)
    assert offloaded == 11 and "this machine's GPUs" in summary


def test_the_output_layer_stays_here_unless_asked_or_the_workers_would_hold_it_alone():
    one = [_info(1, GIB)]
    assert keeps_output_local(2) and keeps_output_local(11)
    assert not keeps_output_local(1)  # the workers' only layer: moving it would leave them nothing
    assert not keeps_output_local(0)  # nothing offloaded
    assert not keeps_output_local(11, local_gpus=1)  # llama.cpp gives it to this machine's last GPU
    assert not keeps_output_local(5, wanted=False)
    # where llama.cpp puts it (LoadConfig.local_output=False): the last worker, as the summary says
    assert plan(2, one, local_free=GIB, local_output=False) == (
        2,
        "layer 0 on this machine, layer 1 and the output on 127.0.0.1:1",
    )
    assert plan(10, one, local_free=GIB, gpu_layers=99, local_output=False) == (
        11,
        "layers 0-9 and the output on 127.0.0.1:1",
    )
    # the count of offloaded layers does not change with it: llama.cpp still counts the output
    for n_layer in (2, 5, 28):
        for free in (1, GIB, 1 << 50):
            assert (
                plan(n_layer, one, local_free=free)[0]
                == plan(n_layer, one, local_free=free, local_output=False)[0]
            )
