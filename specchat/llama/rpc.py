"""A target split over this machine and llama.cpp RPC workers (`--rpc HOST:PORT,...`): the workers'
devices from the build's ggml-rpc, and where the target's layers go.

How llama.cpp places a split (src/llama.cpp, llama-model.cpp): the model's `devices` list gets the
offloaded layers, `n_gpu_layers` of them counted from the end (the output layer counts as one), shared
among the devices by `tensor_split` or, when that is left empty, by each device's free memory; the
layers before them, and the input embeddings always, stay on this machine's CPU. llama-server's
`--rpc` registers each worker's devices globally, so every model of the process (a draft too) may be
placed on them. Here they are only ever named in the target's own `devices` list: the draft models
and the drafters' heads load with llama.cpp's default list, which then holds this machine's GPUs
alone, and stay local.

So on a CPU-only machine the split is made with `n_gpu_layers`: this machine keeps the share of the
layers its memory is of the whole (at least none, at most all but one), the workers take the rest and
share it by their free memory. Where this machine has GPUs they join the list after the workers, and
llama.cpp shares every offloaded layer by free memory as llama-server does.

The output layer is the exception: llama.cpp would put it on the last worker, and every decode would
then bring a full-vocabulary row of logits back over the network per output token. A split keeps it
on this machine's CPU instead (llama/output_layer.py), in the buffer the unsplit load gives it, so
only hidden states cross and the logits keep their unsplit bits. Not where this machine's GPUs join
the split (the last device, which llama.cpp gives the output layer, is then one of them), nor where
the workers would take the output layer alone.

Before any of this the workers have answered `rpc_wire.probe` (llama.cpp aborts the process on a
worker it cannot reach): `plan` is pure arithmetic on those answers, `worker_devices` asks
ggml-rpc for each worker's devices only after that.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BadInput, WorkerError
from .devices import ggml_lib
from .lib import llama_cpp
from .rpc_wire import Endpoint, WorkerInfo


def rpc_supported() -> bool:
    """Whether the installed llama.cpp has the RPC backend (`make install` builds it in; a stock
    llama-cpp-python wheel does not)."""
    lib = ggml_lib()
    return lib is not None and hasattr(lib, "ggml_backend_rpc_add_server")


def build_tag() -> int | None:
    """This build's tag for its RPC workers: a byte of the patch queue's hash (1..255), which `specchat
    worker` answers HELLO with as its patch version (patch 0009's ggml_backend_rpc_set_server_build_tag)
    and `--rpc` expects. A worker of another build -- another specchat, another queue, llama.cpp's own
    ggml-rpc-server (which answers 0) -- computes with other kernels, so the split would part from the
    one-machine output. None on a build that cannot tag (stock, or a queue without the patch)."""
    from .build import installed_queue

    queue = installed_queue()
    lib = ggml_lib()
    if not queue or lib is None or not hasattr(lib, "ggml_backend_rpc_set_server_build_tag"):
        return None
    try:
        return 1 + int(queue[:8], 16) % 255
    except ValueError:
        return None


def require_rpc(what: str) -> ctypes.CDLL:
    """The library with ggml-rpc, or one line saying the build has none."""
    lib = ggml_lib()
    if lib is None or not hasattr(lib, "ggml_backend_rpc_add_server"):
        raise BadInput(
            f"{what} needs llama.cpp's RPC backend, which this llama-cpp-python was built without",
            "`make install` builds specchat's llama.cpp with it (GGML_RPC=ON)",
        )
    return lib


@dataclass(frozen=True, slots=True)
class Split:
    """Where a target's layers go: `gpu_layers` of them (from the end, output included) to `devices`
    (ggml device handles: the workers', then this machine's GPUs), the rest on this machine's CPU,
    the output layer too where `local_output`."""

    gpu_layers: int
    devices: tuple[int, ...]
    #: one line for the user: which machine holds which layers
    summary: str
    #: the output layer stays on this machine's CPU though it is counted in `gpu_layers`
    #: (LoadOptions.local_output)
    local_output: bool = False


def keeps_output_local(offloaded: int, *, local_gpus: int = 0, wanted: bool = True) -> bool:
    """Whether a split with `offloaded` layers (output counted) keeps its output layer on this
    machine's CPU: when `wanted`, where the workers hold repeating layers (more than the output alone)
    and this machine has no GPU of its own in the split (which would hold the output already)."""
    return wanted and offloaded > 1 and not local_gpus


def plan(
    n_layer: int,
    workers: Sequence[WorkerInfo],
    *,
    local_free: int,
    local_gpus: int = 0,
    gpu_layers: int | None = None,
    local_output: bool = True,
) -> tuple[int, str]:
    """(n_gpu_layers, summary) for a target of `n_layer` layers over this machine and `workers`.

    `local_free` is this machine's free memory for its share (its CPU's, on a CPU-only machine);
    `local_gpus` how many GPUs of its own join the split; `gpu_layers` the user's --gpu-layers, which
    wins; `local_output`: keep the output layer here where `keeps_output_local` allows (the summary
    says where it is). Pure arithmetic, tested without llama.cpp."""
    names = ", ".join(str(w.endpoint) for w in workers)
    remote = sum(w.free_bytes for w in workers)
    if gpu_layers is not None and gpu_layers >= 0:
        offloaded = min(gpu_layers, n_layer + 1)
    elif local_gpus:
        offloaded = n_layer + 1  # every layer to the devices, shared by free memory (as llama-server)
    else:
        share = local_free / (local_free + remote) if local_free + remote > 0 else 0.5
        offloaded = n_layer + 1 - min(max(round(n_layer * share), 0), n_layer - 1)
    kept = min(n_layer, n_layer + 1 - offloaded)  # repeating layers on this machine's CPU
    if local_gpus and offloaded > 0:
        where = (
            f"{offloaded} of {n_layer + 1} layers (the output counted) shared by free memory over "
            f"{names} and this machine's GPUs"
        )
    elif offloaded == 0:
        where = f"every layer on this machine, none on {names}"
    elif keeps_output_local(offloaded, local_gpus=local_gpus, wanted=local_output):
        here = f"{_layers(0, kept - 1)} and the output" if kept else "the output layer"
        where = f"{here} on this machine, {_layers(kept, n_layer - 1)} on {names}"
    else:
        remote = f"{_layers(kept, n_layer - 1)} and the output" if kept < n_layer else "the output layer"
        where = (f"{_layers(0, kept - 1)} on this machine, " if kept else "") + f"{remote} on {names}"
    return offloaded, where


def _layers(first: int, last: int) -> str:
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def worker_devices(lib: ctypes.CDLL, endpoint: Endpoint) -> tuple[int, ...]:
    """The ggml devices of one worker (ggml_backend_rpc_add_server), without registering them in the
    global device list (see the module's docstring). Call only after `rpc_wire.probe` answered."""
    add = lib.ggml_backend_rpc_add_server
    add.restype, add.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    count, get = lib.ggml_backend_reg_dev_count, lib.ggml_backend_reg_dev_get
    count.restype, count.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]
    llama_cpp.llama_backend_init()
    reg = add(str(endpoint).encode())
    if not reg:  # no device, or (with patch 0006) it stopped answering since the probe
        raise WorkerError(
            f"the RPC worker {endpoint} offers no device, or stopped answering since it was asked",
            "check that `specchat worker` still runs there",
        )
    return tuple(int(get(reg, i)) for i in range(int(count(reg))))


def failed_worker(lib: ctypes.CDLL | None, endpoints: Sequence[str]) -> str | None:
    """The first of `endpoints` whose connection failed while in use (it died, or the link dropped),
    by ggml_backend_rpc_failed (patch 0006 in patches/llama.cpp); None while they all answer, and
    always on a build without that patch (where such a failure aborts the process instead)."""
    fn = getattr(lib, "ggml_backend_rpc_failed", None) if lib is not None else None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_bool, [ctypes.c_char_p]
    return next((e for e in endpoints if fn(e.encode())), None)


def worker_lost(endpoint: str) -> WorkerError:
    """The one line for a worker that stopped answering while the target was using it."""
    return WorkerError(
        f"the RPC worker {endpoint} stopped answering (it died, or the link to it dropped)",
        f"restart it (`specchat worker --port {endpoint.rsplit(':', 1)[-1]}` there) and run again: the "
        "target's layers on it were lost with it",
    )


def local_gpu_devices(lib: ctypes.CDLL) -> tuple[int, ...]:
    """This machine's GPUs (dedicated or integrated) in llama.cpp's device list, in its order."""
    n, get, kind = lib.ggml_backend_dev_count, lib.ggml_backend_dev_get, lib.ggml_backend_dev_type
    n.restype, n.argtypes = ctypes.c_size_t, []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    kind.restype, kind.argtypes = ctypes.c_int, [ctypes.c_void_p]
    devs = (get(i) for i in range(int(n())))
    return tuple(int(d) for d in devs if d and kind(d) in (1, 2))


def split_target(
    n_layer: int,
    workers: Sequence[WorkerInfo],
    *,
    local_free: int,
    gpu_layers: int | None = None,
    local_output: bool = True,
) -> Split:
    """The target's placement over this machine and the (probed) workers, their devices in hand;
    `local_output`: keep the output layer here where it would go to a worker (see `plan`)."""
    lib = require_rpc("--rpc")
    remote = tuple(d for w in workers for d in worker_devices(lib, w.endpoint))
    local = local_gpu_devices(lib)
    offloaded, summary = plan(
        n_layer,
        workers,
        local_free=local_free,
        local_gpus=len(local),
        gpu_layers=gpu_layers,
        local_output=local_output,
    )
    here = keeps_output_local(offloaded, local_gpus=len(local), wanted=local_output)
    return Split(gpu_layers=offloaded, devices=(*remote, *local), summary=summary, local_output=here)
