"""The tie margin's noise measurement visits the KV lengths where llama.cpp's backends switch kernels:
both sides of the CPU's 512-cell split and past 1,024 and 4,096 cells (Metal's and CUDA's attention
buckets), clipped to the context. On a tiny real model (tests/tiny_models.py), so the lengths are the
ones a real decode reaches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specchat.decoding.calibration import NOISE_CONTEXTS, batch_noise, noise_lengths
from specchat.llama.engine import LlamaModel, LoadOptions

from .tiny_models import write_tiny_llama


class Recorder:
    """The model, with the cache length at which each multi-row batch was decoded written down."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.batches: list[tuple[int, int]] = []  # (tokens in the cache before it, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def decode(self, tokens: Sequence[int], logit_rows: Sequence[int]) -> Any:
        if len(logit_rows) > 1:
            self.batches.append((len(self.model.tokens), len(tokens)))
        return self.model.decode(tokens, logit_rows)


def test_the_noise_lengths_straddle_every_backend_bucket_and_clip_to_the_context():
    assert NOISE_CONTEXTS == (300, 600, 1024, 4096)
    assert noise_lengths(8192) == [300, 600, 1024, 4096]
    # the default context: the last length still fills the KV view to 4,096 cells with its batch
    assert noise_lengths(4096) == [300, 600, 1024, 4079]
    assert noise_lengths(1024) == [300, 600, 1007]
    assert noise_lengths(256) == [239]


def test_batch_noise_decodes_verify_batches_after_every_length(tmp_path):
    path = write_tiny_llama(tmp_path / "t.gguf", seed=4, n_head_kv=2, n_ctx_train=8192)
    with LlamaModel(path, LoadOptions(n_ctx=4352, gpu_layers=0, threads=1)) as model:
        spy = Recorder(model)
        noise = batch_noise(spy, sizes=(4, 16), drift=32)  # type: ignore[arg-type]
        assert model.tokens == []  # it leaves the cache empty
    after = {length for length, rows in spy.batches if rows in (4, 16)}
    assert {300, 600, 1024, 4096} <= after  # each length, both sizes (and the drift rows after 300)
    assert sorted(rows for length, rows in spy.batches if length == 4096) == [4, 16]
    assert noise >= 0.0
