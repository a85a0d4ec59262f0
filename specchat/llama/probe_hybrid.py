"""Tiny hybrid GGUF files for the batch-invariance probe: a Qwen3.5 layout (three Gated DeltaNet layers
and one gated attention layer) and an LFM2 layout (short convolutions and attention), every matmul
weight Q4_K.

Why the probe needs them: a verify batch on a hybrid target runs the recurrent ops (the gated delta
net, the causal convolutions) over several tokens at once. On the CPU they step token by token, so a
row of a batch is what one-token decoding computes -- if the projections around them are batch
invariant too (the patch queue). The probe shows it on the installed build rather than assuming it.
Written without the `gguf` package for the same reason as probe_model's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .probe_model import Tensor, _blocks, vocab_meta, write_gguf

#: every matmul's inner dimension is 256 (a K-quant block); 2 linear-attention heads of 128
SHAPES = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "head_dim": 64, "n_vocab": 288}
LIN_HEADS, LIN_DIM, CONV = 2, 128, 4
HYBRID_ARCHS = ("qwen35", "lfm2")


def write_probe_hybrid(path: Path, arch: str, *, seed: int = 0, n_ctx: int = 256) -> Path:
    """A four-layer `arch` GGUF ("qwen35" or "lfm2") whose matmul weights are Q4_K."""
    import numpy as np

    if arch not in HYBRID_ARCHS:
        raise ValueError(f"no probe layout for {arch!r}")
    s = SHAPES
    d, ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    rng = np.random.default_rng(seed)

    def f32(*shape: int, scale: float = 0.1, mean: float = 1.0) -> Tensor:
        data = (mean + scale * rng.standard_normal(tuple(reversed(shape)))).astype(np.float32)
        return "F32", shape, data.tobytes()

    def q(n_out: int, n_in: int, gain: float = 1.0) -> Tensor:
        return "Q4_K", (n_in, n_out), _blocks("Q4_K", n_out, n_in, rng, gain)

    meta: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": f"specchat-probe-{arch}",
        "general.file_type": 15,
        "general.alignment": 32,
        f"{arch}.context_length": n_ctx,
        f"{arch}.embedding_length": d,
        f"{arch}.block_count": 4,
        f"{arch}.feed_forward_length": ff,
        f"{arch}.attention.head_count": s["n_head"],
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.vocab_size": s["n_vocab"],
        f"{arch}.rope.freq_base": 10000.0,
        **vocab_meta(s["n_vocab"]),
    }
    tensors: dict[str, Tensor] = {
        "token_embd.weight": f32(d, s["n_vocab"], scale=1.0, mean=0.0),
        "output.weight": q(s["n_vocab"], d, 4.0),
    }
    if arch == "qwen35":
        kv = s["n_head_kv"] * hd
        meta |= {
            "qwen35.attention.head_count_kv": s["n_head_kv"],
            "qwen35.attention.key_length": hd,
            "qwen35.attention.value_length": hd,
            "qwen35.rope.dimension_count": hd,
            "qwen35.rope.dimension_sections": [hd // 8, hd // 8, hd // 4, 0],
            "qwen35.full_attention_interval": 4,
            "qwen35.ssm.conv_kernel": CONV,
            "qwen35.ssm.inner_size": LIN_HEADS * LIN_DIM,
            "qwen35.ssm.state_size": LIN_DIM,
            "qwen35.ssm.time_step_rank": LIN_HEADS,
            "qwen35.ssm.group_count": LIN_HEADS,
        }
        tensors["output_norm.weight"] = f32(d)
        for il in range(4):
            p = f"blk.{il}."
            tensors[p + "attn_norm.weight"] = f32(d)
            tensors[p + "post_attention_norm.weight"] = f32(d)
            if il < 3:  # Gated DeltaNet
                lin = LIN_HEADS * LIN_DIM
                tensors |= {
                    p + "attn_qkv.weight": q(3 * lin, d),
                    p + "attn_gate.weight": q(lin, d),
                    p + "ssm_conv1d.weight": f32(CONV, 3 * lin, scale=0.5, mean=0.0),
                    p + "ssm_dt.bias": f32(LIN_HEADS, scale=0.5, mean=-3.0),
                    p + "ssm_a": f32(LIN_HEADS, scale=1.0, mean=-4.0),
                    p + "ssm_beta.weight": f32(d, LIN_HEADS, scale=0.05, mean=0.0),
                    p + "ssm_alpha.weight": f32(d, LIN_HEADS, scale=0.05, mean=0.0),
                    p + "ssm_norm.weight": f32(LIN_DIM),
                    p + "ssm_out.weight": q(d, lin),
                }
            else:  # gated attention: the query projection carries the gate
                tensors |= {
                    p + "attn_q.weight": q(2 * s["n_head"] * hd, d, 2.0),
                    p + "attn_k.weight": q(kv, d, 2.0),
                    p + "attn_v.weight": q(kv, d),
                    p + "attn_output.weight": q(d, s["n_head"] * hd),
                    p + "attn_q_norm.weight": f32(hd),
                    p + "attn_k_norm.weight": f32(hd),
                }
            tensors |= _ffn(p, q, d, ff)
    else:
        meta |= {
            "lfm2.attention.head_count_kv": [0, 0, s["n_head_kv"], 0],  # 0: a short-convolution layer
            "lfm2.shortconv.l_cache": 3,
            "lfm2.rope.dimension_count": hd,
        }
        tensors["token_embd_norm.weight"] = f32(d)  # LFM2's output norm, under llama.cpp's name
        for il in range(4):
            p = f"blk.{il}."
            tensors[p + "attn_norm.weight"] = f32(d)
            tensors[p + "ffn_norm.weight"] = f32(d)
            if il != 2:
                tensors |= {
                    p + "shortconv.conv.weight": f32(3, d, scale=0.5, mean=0.0),
                    p + "shortconv.in_proj.weight": q(3 * d, d),
                    p + "shortconv.out_proj.weight": q(d, d),
                }
            else:
                kv = s["n_head_kv"] * hd
                tensors |= {
                    p + "attn_q.weight": q(d, d, 2.0),
                    p + "attn_k.weight": q(kv, d, 2.0),
                    p + "attn_v.weight": q(kv, d),
                    p + "attn_output.weight": q(d, d),
                    p + "attn_q_norm.weight": f32(hd),
                    p + "attn_k_norm.weight": f32(hd),
                }
            tensors |= _ffn(p, q, d, ff)
    return write_gguf(path, meta, tensors)


def _ffn(p: str, q: Any, d: int, ff: int) -> dict[str, Tensor]:
    return {
        p + "ffn_gate.weight": q(ff, d),
        p + "ffn_up.weight": q(ff, d),
        p + "ffn_down.weight": q(d, ff),
    }
