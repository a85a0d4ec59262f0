"""The RPC workers of a split target (`--rpc`) as the loader uses them: asked before anything loads,
the memory they lend to the fit check, where the target's layers go, and the calibration key that
keeps a split's measured verify curve apart from this machine's own. The llama.cpp side (the wire
probe, the workers' devices, the placement arithmetic) is in llama/rpc.py and llama/rpc_wire.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import hardware

if TYPE_CHECKING:
    from ..llama.rpc import Split
    from ..llama.rpc_wire import WorkerInfo


def probe_workers(endpoints: Sequence[str], *, same_build: bool = True) -> list[WorkerInfo]:
    """Each --rpc worker asked for its version and memory (llama/rpc_wire.py), on a build that has
    the RPC backend: one line for the first that cannot be used. Empty without --rpc. `same_build`:
    a worker of another build is refused too (--force lets it compute)."""
    if not endpoints:
        return []
    from ..llama.rpc import build_tag, require_rpc
    from ..llama.rpc_wire import parse_endpoints, probe

    require_rpc("--rpc")
    tag = build_tag() if same_build else None
    return [probe(e, build_tag=tag) for e in parse_endpoints(",".join(endpoints))]


def lent(workers: Sequence[WorkerInfo]) -> list[tuple[str, int]]:
    """Each worker's address and the memory it reports free (what a split may place there)."""
    return [(str(w.endpoint), w.free_bytes) for w in workers]


def place(workers: Sequence[WorkerInfo], info: Any, gpu_layers: int | None, local_output: bool) -> Split:
    """The target's layers over this machine and the workers, by free memory, the output layer here
    where `local_output` (llama/rpc.py)."""
    from ..llama.devices import device_memory
    from ..llama.rpc import split_target

    cpu = [d.free_bytes for d in device_memory() if d.kind == "cpu"]
    local = cpu[0] if cpu else hardware.machine_memory([]).ram_total
    return split_target(
        int(info.n_layer), workers, local_free=local, gpu_layers=gpu_layers, local_output=local_output
    )


def workers_key(workers: Sequence[WorkerInfo]) -> str:
    """The workers of a split as a calibration key: address, protocol and each device's total memory
    (free memory moves between runs; the total names the machine)."""
    return ",".join(
        f"{w.endpoint}/{'.'.join(map(str, w.version))}/{'+'.join(str(total) for _, total in w.memory)}"
        for w in workers
    )
