"""Machine facts and the fit check: will this model pair fit in memory before we try to load it?

Why: llama.cpp fails late and obscurely when memory runs out (or the OS starts swapping and everything
crawls). Estimating the footprint from the GGUF headers costs milliseconds and lets us refuse with the
numbers and a way out. GPU facts (offload support, VRAM) come from the engine, the only module that
imports llama_cpp; they are passed in here as plain values.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from specchat.errors import NotEnoughMemory
from specchat.gguf_meta import GGUFInfo

GIB = 1024**3
MIB = 1024**2

# Compute-buffer allowance, per model. llama.cpp reserves one scratch buffer for the graph of a full
# micro-batch (n_ubatch tokens); the graph allocator reuses memory, so its size is set by the largest
# intermediate: the logits (n_ubatch x n_vocab floats) or, without flash attention, the attention scores
# (n_ubatch x n_ctx x n_head floats). We take that plus 10% and a fixed 16 MiB. Measured with llama.cpp
# (CPU, llama-cpp-python 0.3.36): Qwen2.5-1.5B at n_ctx 4096 -> 305.8 MiB (estimate 342); 0.5B at 16384 ->
# 489.3 MiB (estimate 509), at 32768 -> 969.3 MiB (estimate 1001).
DEFAULT_UBATCH = 512
COMPUTE_OVERHEAD_BYTES = 16 * MIB
"""Fixed per-model slack: the output buffer, small graph tensors, llama.cpp's own bookkeeping."""

MIN_SUGGESTED_CTX = 512


def kv_cache_bytes(info: GGUFInfo, n_ctx: int, type_bytes: int = 2) -> int:
    """Bytes of the K and V caches for `n_ctx` positions (f16 by default, as llama.cpp allocates them).

    Per layer: n_ctx x n_head_kv x (key_length + value_length) x type_bytes, which for the usual
    key_length == value_length == n_embd / n_head is 2 * n_ctx * n_embd_k_gqa * type_bytes.
    """
    return n_ctx * kv_bytes_per_token(info, type_bytes)


def kv_bytes_per_token(info: GGUFInfo, type_bytes: int = 2) -> int:
    """KV-cache bytes one more context position costs: what the context size trades against."""
    per_layer_heads = info.n_head_kv_per_layer
    if len(per_layer_heads) != info.n_layer:  # a per-layer list that disagrees: trust the maximum
        per_layer_heads = [info.n_head_kv] * info.n_layer
    return sum(per_layer_heads) * (info.key_length + info.value_length) * type_bytes


def compute_buffer_bytes(info: GGUFInfo, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH) -> int:
    """An allowance for llama.cpp's compute buffer (see the comment on DEFAULT_UBATCH)."""
    largest = 4 * n_ubatch * max(info.n_vocab, n_ctx * info.n_head)
    return largest + largest // 10 + COMPUTE_OVERHEAD_BYTES


@dataclass(frozen=True)
class ModelFootprint:
    """One model's share: mapped weights, its KV cache and its compute buffer."""

    path: Path
    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class Footprint:
    """The estimated memory needed to run all models (target and draft) at context size `n_ctx`."""

    models: tuple[ModelFootprint, ...]
    n_ctx: int

    @property
    def weights_bytes(self) -> int:
        return sum(m.weights_bytes for m in self.models)

    @property
    def kv_bytes(self) -> int:
        return sum(m.kv_bytes for m in self.models)

    @property
    def compute_bytes(self) -> int:
        return sum(m.compute_bytes for m in self.models)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    def largest_ctx_within(self, budget: int) -> int:
        """The largest context size (a power of two, not above n_ctx) that fits `budget`, or 0."""
        fixed = self.weights_bytes + self.compute_bytes
        per_token = sum(m.kv_bytes_per_token for m in self.models)
        if per_token == 0 or fixed >= budget:
            return 0
        ctx = self.n_ctx
        while ctx >= MIN_SUGGESTED_CTX:
            if fixed + ctx * per_token <= budget:
                return ctx
            ctx = 1 << (ctx.bit_length() - 1) if ctx & (ctx - 1) else ctx // 2
        return 0


def estimate_footprint(
    paths_and_infos: Iterable[tuple[str | os.PathLike[str], GGUFInfo]],
    n_ctx: int,
    *,
    kv_type_bytes: int = 2,
    n_ubatch: int = DEFAULT_UBATCH,
) -> Footprint:
    """Estimate what loading these models with context `n_ctx` needs: file size + KV cache + compute.

    The weights count at their file size: they are memory-mapped and every one is read for every token.
    (On x86 llama.cpp repacks some quantised tensors into an anonymous buffer at load time — 597 MiB of
    the 1.5B's 1066 MiB — but the mapped pages of those tensors are then never touched again and can be
    reclaimed, so the steady state is still about the file size.)
    """
    models = []
    for path, info in paths_and_infos:
        per_token = kv_bytes_per_token(info, kv_type_bytes)
        models.append(
            ModelFootprint(
                path=Path(path),
                weights_bytes=info.file_size,
                kv_bytes=n_ctx * per_token,
                kv_bytes_per_token=per_token,
                compute_bytes=compute_buffer_bytes(info, n_ctx, n_ubatch),
            )
        )
    return Footprint(models=tuple(models), n_ctx=n_ctx)


def available_ram() -> int:
    """RAM the OS can give us now without swapping (includes reclaimable page cache)."""
    return int(psutil.virtual_memory().available)


def fit_check(
    footprint: Footprint,
    *,
    gpu_offload: bool,
    vram_bytes: int | None,
    force: bool,
    ram_bytes: int | None = None,
) -> None:
    """Raise `NotEnoughMemory` (numbers + a way out) when the footprint will not fit, unless `force`.

    With GPU offload and a known `vram_bytes`, the footprint must fit in VRAM. When VRAM cannot be
    measured (e.g. Apple silicon's unified memory) we check against RAM, the only number we have.
    `ram_bytes` overrides the measured available RAM (for tests).
    """
    if force:
        return
    need = footprint.total_bytes
    if gpu_offload and vram_bytes is not None:
        if need <= vram_bytes:
            return
        where, have = "GPU memory", vram_bytes
        ways = [
            "a smaller quantisation",
            _ctx_advice(footprint, have),
            "fewer --gpu-layers (and more RAM use)",
        ]
    else:
        have = available_ram() if ram_bytes is None else ram_bytes
        if need <= have:
            return
        where = "RAM available"
        ways = ["a smaller quantisation", _ctx_advice(footprint, have)]
        if not gpu_offload:
            ways.append("--gpu-layers if you have a GPU")
    advice = ", ".join(w for w in ways if w)
    raise NotEnoughMemory(
        f"not enough memory: these models need about {_gb(need)} ({_breakdown(footprint)}) but only "
        f"{_gb(have)} of {where} — try {advice}, or --force to try anyway"
    )


def _ctx_advice(footprint: Footprint, budget: int) -> str:
    ctx = footprint.largest_ctx_within(budget)
    if 0 < ctx < footprint.n_ctx:
        return f"a smaller --ctx-size (e.g. {ctx})"
    if footprint.kv_bytes > footprint.weights_bytes // 4:
        return "a smaller --ctx-size"
    return ""


def _breakdown(footprint: Footprint) -> str:
    return (
        f"weights {_gb(footprint.weights_bytes)} + KV cache {_gb(footprint.kv_bytes)} for --ctx-size "
        f"{footprint.n_ctx} + compute {_gb(footprint.compute_bytes)}"
    )


def _gb(n: int) -> str:
    """Human sizes in binary units, written GB/MB as users expect."""
    if n >= GIB:
        return f"{n / GIB:.1f} GB"
    return f"{n / MIB:.0f} MB"


def physical_cores() -> int:
    """Physical cores we may run on: the default thread count (hyper-threads slow llama.cpp down).

    Containers and `taskset` restrict the CPUs a process may use; the smaller number wins.
    """
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        allowed = physical
    return max(1, min(physical, allowed))


def system_facts() -> dict[str, Any]:
    """Plain facts for `specchat doctor` and bug reports (JSON-serialisable)."""
    vm = psutil.virtual_memory()
    return {
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "python": sys.version.split()[0],
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "usable_cores": physical_cores(),
        "ram_total_bytes": int(vm.total),
        "ram_available_bytes": int(vm.available),
    }


def _cpu_name() -> str:
    """The CPU model: /proc/cpuinfo on Linux (platform.processor() is empty there), else platform."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
