"""Machine facts and the fit check: will this model pair fit in memory before we try to load it?

Why: llama.cpp fails late and obscurely when memory runs out (or the OS starts swapping and everything
crawls). Estimating the footprint from the GGUF headers costs milliseconds and lets us refuse with the
numbers and a way out. GPU facts (offload support, each device's memory) come from
`llama/devices.py`, since only `specchat/llama/` imports llama_cpp; they are passed in here as plain
values.
"""

from __future__ import annotations

import math
import os
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from specchat.errors import NotEnoughMemory
from specchat.models.gguf import GGUFInfo

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
    #: from file sizes before a download (no GGUF header yet), not from the files' headers
    estimated: bool = False

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
    (On x86 llama.cpp repacks some quantised tensors into an anonymous buffer at load time — 934 MiB of
    the 1.5B's 1066 MiB with patch 0013's Q6_K repack on AVX512 VNNI, 597 MiB without — but the mapped
    pages of those tensors are then never touched again and can be reclaimed, so the steady state is
    still about the file size.)
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


#: KV-cache bytes per context position of a 1B-parameter model, and how it grows: per token a model
#: stores n_layer x n_head_kv x head_dim x 2 (K and V) x 2 bytes, and the GQA models in the registry
#: follow about 40 KiB x sqrt(params / 1B) (Llama 3.2 1B: 32 KiB, 3.1 8B: 128 KiB, 3.3 70B: 320 KiB;
#: Qwen2.5 0.5B/1.5B: 12/28 KiB). Models without GQA need up to 4x more: that is why it is an estimate.
KV_PER_TOKEN_1B = 40 * 1024
#: bits per weight of the common GGUF quantisations (file size x 8 / parameters, as llama.cpp lists them)
BITS_PER_WEIGHT = {
    "Q2_K": 3.35, "Q3_K": 3.9, "IQ3": 3.5, "Q4_0": 4.55, "Q4_1": 5.0, "IQ4": 4.4, "Q4_K": 4.85,
    "Q5_0": 5.5, "Q5_1": 6.0, "Q5_K": 5.7, "Q6_K": 6.56, "Q8_0": 8.5, "F16": 16.0, "BF16": 16.0,
    "F32": 32.0,
}  # fmt: skip
_QUANT_RE = re.compile(r"(?<![A-Z0-9])(BF16|F16|F32|IQ[1-4]|Q[2-8]_(?:K|0|1))", re.IGNORECASE)
#: vocabulary assumed for the compute buffer before the header is known (Qwen2.5's; Llama 3 has 128,256)
ASSUMED_VOCAB = 152_064
ASSUMED_HEADS = 32


def parse_params(text: str | None) -> float | None:
    """ "70B" / "1.5B" / "270M" (models.toml's params) as a number of parameters, else None."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMBT])\s*", text or "", re.IGNORECASE)
    if not match:
        return None
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[match.group(2).upper()]
    return float(match.group(1)) * scale


def bits_per_weight(quant_or_name: str | None) -> float:
    """Bits per weight for a quantisation named in a file name or reference (Q4_K_M when unknown)."""
    match = _QUANT_RE.search(quant_or_name or "")
    return BITS_PER_WEIGHT.get(match.group(1).upper(), 4.85) if match else 4.85


def estimate_from_size(
    path: str | os.PathLike[str],
    size_bytes: int,
    n_ctx: int,
    *,
    params: float | None = None,
    quant: str | None = None,
    n_ubatch: int = DEFAULT_UBATCH,
) -> ModelFootprint:
    """A model's footprint before its file exists: weights = the file size; the KV cache from the
    parameter count (given, else file size x 8 / bits per weight of `quant`); compute as for the
    largest common vocabulary. Errs on the high side for small models, which fit anyway."""
    n_params = params or size_bytes * 8 / bits_per_weight(quant or str(path))
    per_token = int(KV_PER_TOKEN_1B * math.sqrt(max(n_params, 1e8) / 1e9))
    largest = 4 * n_ubatch * max(ASSUMED_VOCAB, n_ctx * ASSUMED_HEADS)
    return ModelFootprint(
        path=Path(path),
        weights_bytes=size_bytes,
        kv_bytes=n_ctx * per_token,
        kv_bytes_per_token=per_token,
        compute_bytes=largest + largest // 10 + COMPUTE_OVERHEAD_BYTES,
    )


@dataclass(frozen=True)
class MachineMemory:
    """The memory the fit check may plan with: RAM, and GPU memory where llama.cpp reports a GPU."""

    ram_available: int
    ram_total: int
    gpu_free: int | None = None  # dedicated GPU memory free, over all GPUs; None: no GPU reported
    gpu_total: int | None = None
    unified: bool = False  # Apple Silicon: the GPU works in RAM, so its memory is not extra
    gpu_names: tuple[str, ...] = ()

    def describe(self) -> str:
        """ "23.5 GB RAM, 8.0 GB GPU memory (CUDA0)" for messages."""
        ram = f"{_gb(self.ram_total)} RAM"
        if self.unified:
            shared = f", of which the GPU may use {_gb(self.gpu_total)}" if self.gpu_total else ""
            return f"{ram} shared with the GPU (unified memory{shared})"
        if self.gpu_total is None:
            return f"{ram}, no GPU memory llama.cpp can use"
        names = f" ({', '.join(self.gpu_names)})" if self.gpu_names else ""
        return f"{ram}, {_gb(self.gpu_total)} GPU memory{names}"


def machine_memory(
    devices: Iterable[Any],
    *,
    system: str | None = None,
    machine: str | None = None,
    ram_available: int | None = None,
    ram_total: int | None = None,
) -> MachineMemory:
    """RAM from psutil plus the GPUs among llama.cpp's devices (engine.device_memory()'s values).

    On Apple Silicon (Darwin arm64) Metal's "GPU memory" is the part of RAM the GPU may use, so it is
    kept as a limit within RAM, never added to it.
    """
    vm = psutil.virtual_memory() if ram_available is None or ram_total is None else None
    avail = int(vm.available) if vm is not None and ram_available is None else int(ram_available or 0)
    total = int(vm.total) if vm is not None and ram_total is None else int(ram_total or 0)
    gpus = [d for d in devices if getattr(d, "kind", "") == "gpu" and getattr(d, "total_bytes", 0) > 0]
    if not gpus:
        return MachineMemory(ram_available=avail, ram_total=total)
    unified = (system or platform.system()) == "Darwin" and (machine or platform.machine()) == "arm64"
    return MachineMemory(
        ram_available=avail,
        ram_total=total,
        gpu_free=sum(int(d.free_bytes) for d in gpus),
        gpu_total=sum(int(d.total_bytes) for d in gpus),
        unified=unified,
        gpu_names=tuple(str(d.name) for d in gpus),
    )


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
    memory: MachineMemory | None = None,
    workers: Sequence[tuple[str, int]] = (),
) -> None:
    """Raise `NotEnoughMemory` (numbers + a way out) when the footprint will not fit, unless `force`.

    With GPU offload and known GPU memory (`vram_bytes`, else `memory.gpu_free`), the footprint must
    fit there. With unified memory (Apple Silicon) it must fit in RAM and within what the GPU may use
    of it. Otherwise (no GPU, or none reported) it must fit in available RAM. `ram_bytes` overrides the
    measured available RAM (for tests). `workers`: (address, free bytes) of the RPC workers a split
    target's layers may go to (--rpc): their memory adds to this machine's, and a refusal names each.
    """
    if force:
        return
    need = footprint.total_bytes
    unified = memory is not None and memory.unified and gpu_offload
    if vram_bytes is None and memory is not None and not unified:
        vram_bytes = memory.gpu_free
    if ram_bytes is None:
        ram_bytes = memory.ram_available if memory is not None else available_ram()
    if unified:
        assert memory is not None
        have = min(ram_bytes, memory.gpu_free or ram_bytes)
        where = "unified memory available"
        ways = ["a smaller quantisation", _ctx_advice(footprint, have)]
    elif gpu_offload and vram_bytes is not None:
        have, where = vram_bytes, "GPU memory free"
        ways = [
            "a smaller quantisation",
            _ctx_advice(footprint, have),
            "fewer --gpu-layers (and more RAM use)",
        ]
    else:
        have, where = ram_bytes, "RAM available"
        ways = ["a smaller quantisation", _ctx_advice(footprint, have)]
        if not gpu_offload:
            ways.append("--gpu-layers if you have a GPU")
    remote = sum(free for _, free in workers)
    if need <= have + remote:
        return
    if workers:
        shares = ", ".join(f"{_gb(free)} on the worker at {name}" for name, free in workers)
        where = f"{_gb(have)} of {where} here, {shares}"
        have += remote
        ways.insert(0, "another worker (--rpc)")
    else:
        where = f"{_gb(have)} of {where}"
    n = len(footprint.models)
    subject = (
        "this model needs" if n == 1 else "the model and its draft need" if n == 2 else "these models need"
    )
    how = "estimated from the file sizes, before downloading: " if footprint.estimated else ""
    machine = f" (this machine: {memory.describe()})" if memory is not None else ""
    advice = ", ".join(w for w in ways if w)
    anyway = "download and try anyway" if footprint.estimated else "try anyway"
    raise NotEnoughMemory(
        f"not enough memory: {subject} about {_gb(need)} at --ctx-size {footprint.n_ctx} "
        f"({how}{_breakdown(footprint)}) but only {where}{machine} — try {advice}, "
        f"or --force to {anyway}"
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
        f"weights {_gb(footprint.weights_bytes)} + KV cache {_gb(footprint.kv_bytes)} + compute "
        f"{_gb(footprint.compute_bytes)}"
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
