"""Fit-check arithmetic and machine facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from specchat.errors import NotEnoughMemory
from specchat.models import hardware
from specchat.models.gguf import GGUFInfo, read_gguf
from specchat.models.hardware import (
    GIB,
    MIB,
    compute_buffer_bytes,
    estimate_footprint,
    fit_check,
    kv_cache_bytes,
    physical_cores,
    system_facts,
)

from .tiny_models import write_tiny_llama


def fake_info(arch: str = "qwen2", file_size: int = 0, **arch_keys: Any) -> GGUFInfo:
    """A GGUFInfo built from metadata alone (what the fit check reads), no file needed."""
    metadata: dict[str, Any] = {"general.architecture": arch}
    metadata.update({f"{arch}.{k.replace('__', '.')}": v for k, v in arch_keys.items()})
    return GGUFInfo(
        path=Path(f"/models/{arch}.gguf"),
        version=3,
        byteorder="<",
        metadata=metadata,
        tensors=(),
        alignment=32,
        header_size=0,
        data_offset=0,
        tensor_data_end=file_size,
        file_size=file_size,
    )


# Qwen2.5-Coder-1.5B's header values; llama.cpp reports "KV self size = 112.00 MiB" for it at n_ctx 4096.
QWEN_1_5B = {
    "block_count": 28,
    "embedding_length": 1536,
    "feed_forward_length": 8960,
    "attention__head_count": 12,
    "attention__head_count_kv": 2,
    "vocab_size": 151936,
}
QWEN_0_5B = {**QWEN_1_5B, "block_count": 24, "embedding_length": 896, "attention__head_count": 14}


def test_kv_cache_matches_llama_cpp_for_qwen() -> None:
    info = fake_info(file_size=1_117_320_768, **QWEN_1_5B)
    assert kv_cache_bytes(info, 4096) == 112 * MIB
    assert kv_cache_bytes(info, 4096, type_bytes=1) == 56 * MIB
    assert kv_cache_bytes(fake_info(**QWEN_0_5B), 4096) == 48 * MIB


def test_kv_cache_formula_on_a_tiny_model(tmp_path: Path) -> None:
    info = read_gguf(write_tiny_llama(tmp_path / "m.gguf", n_embd=64, n_head=4, n_head_kv=2, n_layer=3))
    n_embd_k_gqa = 64 // 4 * 2
    assert kv_cache_bytes(info, 256) == 2 * 3 * 256 * n_embd_k_gqa * 2


def test_kv_cache_uses_key_and_value_lengths() -> None:
    """Models whose head size is not n_embd / n_head (Gemma, ...) say so in key/value_length."""
    info = fake_info(
        "gemma3",
        block_count=2,
        embedding_length=640,
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__key_length=256,
        attention__value_length=128,
    )
    assert kv_cache_bytes(info, 100) == 100 * 2 * 1 * (256 + 128) * 2


def test_kv_cache_per_layer_head_counts() -> None:
    info = fake_info(
        "mixed",
        block_count=3,
        embedding_length=64,
        attention__head_count=4,
        attention__head_count_kv=[2, 0, 4],
    )
    assert kv_cache_bytes(info, 10) == 10 * (2 + 0 + 4) * (16 + 16) * 2


def test_footprint_adds_up() -> None:
    target = fake_info(file_size=1_117_320_768, **QWEN_1_5B)
    draft = fake_info(file_size=491_400_064, **QWEN_0_5B)
    fp = estimate_footprint([("t.gguf", target), ("d.gguf", draft)], 4096)
    assert [m.path for m in fp.models] == [Path("t.gguf"), Path("d.gguf")]
    assert fp.weights_bytes == 1_117_320_768 + 491_400_064
    assert fp.kv_bytes == kv_cache_bytes(target, 4096) + kv_cache_bytes(draft, 4096)
    assert fp.total_bytes == fp.weights_bytes + fp.kv_bytes + fp.compute_bytes


@pytest.mark.parametrize(
    ("model", "n_ctx", "measured_mib"),
    [("1.5b", 4096, 305.75), ("0.5b", 4096, 302.0), ("0.5b", 16384, 489.26), ("0.5b", 32768, 969.26)],
)
def test_compute_allowance_covers_what_llama_cpp_reserves(
    model: str, n_ctx: int, measured_mib: float
) -> None:
    """The compute buffers llama.cpp reported (CPU, no flash attention) for the default pair."""
    keys = QWEN_1_5B if model == "1.5b" else QWEN_0_5B
    allowance = compute_buffer_bytes(fake_info(**keys), n_ctx)
    assert measured_mib * MIB <= allowance <= 1.2 * measured_mib * MIB


def test_fit_check_passes_refuses_and_can_be_forced() -> None:
    fp = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], 32768)
    fit_check(fp, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=fp.total_bytes)
    with pytest.raises(NotEnoughMemory) as err:
        fit_check(fp, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=fp.total_bytes - 1)
    message = str(err.value)
    assert "\n" not in message
    assert "RAM available" in message and "--ctx-size 32768" in message
    assert "smaller quantisation" in message and "--gpu-layers" in message and "--force" in message
    fit_check(fp, gpu_offload=False, vram_bytes=None, force=True, ram_bytes=0)


def test_fit_check_counts_the_memory_rpc_workers_lend_and_names_each_machine() -> None:
    fp = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], 32768)
    half = fp.total_bytes // 2
    lent = [("192.168.1.7:50052", half), ("127.0.0.1:50053", fp.total_bytes - half - 10)]
    fit_check(fp, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=10, workers=lent)
    with pytest.raises(NotEnoughMemory) as err:
        fit_check(fp, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=9, workers=lent)
    message = str(err.value)
    assert "\n" not in message and "of RAM available here" in message
    assert "on the worker at 192.168.1.7:50052" in message and "on the worker at 127.0.0.1:50053" in message
    assert "another worker (--rpc)" in message and "--force" in message


def test_fit_check_suggests_a_context_that_fits() -> None:
    fp = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], 32768)
    budget = 2 * GIB  # weights + compute fit; the 896 MiB KV cache for 32768 positions does not
    with pytest.raises(NotEnoughMemory, match=r"a smaller --ctx-size \(e\.g\. (\d+)\)") as err:
        fit_check(fp, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=budget)
    suggested = int(str(err.value).split("e.g. ")[1].split(")")[0])
    smaller = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], suggested)
    fit_check(smaller, gpu_offload=False, vram_bytes=None, force=False, ram_bytes=budget)
    assert fp.largest_ctx_within(GIB // 2) == 0  # not even the weights fit: no context can help


def test_fit_check_against_vram() -> None:
    fp = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], 4096)
    fit_check(fp, gpu_offload=True, vram_bytes=2 * GIB, force=False, ram_bytes=0)
    with pytest.raises(NotEnoughMemory, match=r"GPU memory.*fewer --gpu-layers"):
        fit_check(fp, gpu_offload=True, vram_bytes=GIB, force=False, ram_bytes=100 * GIB)
    # VRAM unknown (unified memory): RAM is the only number we have.
    with pytest.raises(NotEnoughMemory, match="RAM available"):
        fit_check(fp, gpu_offload=True, vram_bytes=None, force=False, ram_bytes=GIB)


def test_fit_check_measures_ram_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "available_ram", lambda: 10 * MIB)
    fp = estimate_footprint([("t.gguf", fake_info(file_size=GIB, **QWEN_1_5B))], 4096)
    with pytest.raises(NotEnoughMemory, match="only 10 MB of RAM available"):
        fit_check(fp, gpu_offload=False, vram_bytes=None, force=False)


def test_system_facts() -> None:
    facts = system_facts()
    assert facts["ram_total_bytes"] >= facts["ram_available_bytes"] > 0
    assert facts["logical_cores"] >= 1 and facts["python"].count(".") == 2
    assert isinstance(facts["os"], str) and facts["os"] and isinstance(facts["cpu"], str)
    assert 1 <= physical_cores() <= (psutil.cpu_count(logical=True) or 1)
    assert facts["usable_cores"] == physical_cores()
