"""What llama.cpp runs on: the build's backends and each device's memory (for `doctor`, the fit check
before a download, and bug reports). Split from the engine, which only loads and runs models."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from .lib import llama_cpp

#: ggml_backend_dev_type values of a device with memory of its own to offload layers to (GPU, IGPU)
_OFFLOAD_TYPES = (1, 2)


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU (dedicated or integrated) llama.cpp can offload layers to.

    Why not llama.cpp's own `llama_supports_gpu_offload`: it also answers yes whenever the build has
    the RPC backend (`make install` always builds it, for `specchat worker` and `--rpc`), though a
    CPU-only build with RPC compiled in offloads nothing until `--rpc` names a worker, and a target
    split over workers is placed by `llama/rpc.py`, not by this flag. Asked of the local device
    registry (ggml_backend_dev_by_type), where RPC devices never appear: specchat does not register
    its workers' devices globally, so drafts and heads keep to this machine."""
    if not llama_cpp.llama_supports_gpu_offload():  # (which also loads a dynamic build's backends)
        return False
    lib = ggml_lib()
    by_type = getattr(lib, "ggml_backend_dev_by_type", None) if lib is not None else None
    if by_type is None:
        return True
    by_type.restype, by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    return any(by_type(kind) for kind in _OFFLOAD_TYPES)


def backend_info() -> dict[str, object]:
    """Build facts for `specchat doctor` and bug reports."""
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return {
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "gpu_offload": supports_gpu_offload(),
        "mmap": bool(llama_cpp.llama_supports_mmap()),
        "system_info": sysinfo,
    }


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One ggml backend device and its memory, as llama.cpp reports it (bytes)."""

    name: str
    description: str
    kind: str  # "cpu", "gpu" (dedicated memory: CUDA, ROCm, Metal, Vulkan dGPU) or "other"
    free_bytes: int
    total_bytes: int


#: ggml_backend_dev_type values that are stable across llama.cpp versions (later ones were renumbered:
#: 2 was ACCEL, is now IGPU), so only CPU and dedicated GPU are told apart; the rest count as "other".
_DEV_KINDS = {0: "cpu", 1: "gpu"}


def device_memory() -> list[DeviceMemory]:
    """Every device llama.cpp can use, with free/total memory (ggml_backend_dev_memory).

    llama-cpp-python does not bind the ggml backend device API, so it is bound here with ctypes on
    the library llama-cpp-python loaded (its dependencies export the ggml symbols). Metal reports its
    recommended working set, CUDA the free VRAM, the CPU the system RAM. An empty list when the
    build does not export these functions.
    """
    lib = ggml_lib()
    if lib is None:
        return []
    llama_cpp.llama_backend_init()
    try:
        count = lib.ggml_backend_dev_count
        get, mem = lib.ggml_backend_dev_get, lib.ggml_backend_dev_memory
        kind, name, desc = (
            lib.ggml_backend_dev_type,
            lib.ggml_backend_dev_name,
            lib.ggml_backend_dev_description,
        )
    except AttributeError:
        return []
    count.restype, count.argtypes = ctypes.c_size_t, []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    mem.restype, mem.argtypes = None, [ctypes.c_void_p, size_p, size_p]
    kind.restype, kind.argtypes = ctypes.c_int, [ctypes.c_void_p]
    for fn in (name, desc):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    out = []
    for i in range(int(count())):
        dev = get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        mem(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            DeviceMemory(
                name=(name(dev) or b"").decode(errors="replace"),
                description=(desc(dev) or b"").decode(errors="replace"),
                kind=_DEV_KINDS.get(int(kind(dev)), "other"),
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return out


def ggml_lib() -> ctypes.CDLL | None:
    """The loaded libllama (dlsym finds ggml's symbols through it), else libggml next to it."""
    lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    if lib is not None and hasattr(lib, "ggml_backend_dev_count"):
        return lib
    folder = Path(getattr(lib, "_name", "") or "").parent
    for candidate in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (folder / candidate).is_file():
            try:
                return ctypes.CDLL(str(folder / candidate))
            except OSError:
                continue
    return None
