"""Keep a model's output layer on this machine's CPU while its other layers go to RPC workers.

Why: llama.cpp counts the output layer as the last offloaded layer, so a target split over workers
computes its logits there, and every decode carries them back over the network: one full-vocabulary
row per output token (151,936 x 4 B = 593 KiB on Qwen2.5), k rows for a verify pass of k tokens where
plain decoding moves one. With the output layer here, only the last hidden state crosses (n_embd x 4 B
a row) and the logits are computed where they are read.

How: llama.cpp's `tensor_buft_overrides` (the `-ot` option of its tools) names the output layer's
tensors with the CPU device's buffer type. An override to exactly that type makes the model loader
choose among the CPU's own buffer types for the tensor's operation (llama-model-loader.cpp
`buft_for_tensor`: select_weight_buft over the CPU list), the same choice an unsplit load makes for
it: CPU_REPACK where the CPU repacks the tensor's type (and repacking is on), plain CPU otherwise. So
the output matmul runs the kernel it runs unsplit and the logits keep the unsplit bits. Naming
CPU_REPACK itself would not fall back for a type it cannot repack.

A tied-embedding model (no `output.weight`) loads `token_embd.weight` a second time as its output
(TENSOR_DUPLICATED, placed by the output layer's rules under the same name), so the pattern names it
too; the input embedding matched by the same pattern always stays on this CPU and gets the buffer it
would get anyway (the CPU list, chosen for a row lookup).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..errors import EngineError
from .devices import ggml_lib

#: the output layer's tensors (the final norm and the projection to the vocabulary, with any bias)
#: and a tied model's embedding, which doubles as its projection
OUTPUT_LAYER_PATTERN = r"^(output|output_norm)\.(weight|bias)$|^token_embd\.weight$"

#: ggml_backend_dev_type of the CPU (ggml-backend.h)
_CPU_DEVICE = 0


class _Override(ctypes.Structure):
    """llama.h's `struct llama_model_tensor_buft_override`: a regex over tensor names and the buffer
    type those tensors go to."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True, slots=True)
class Overrides:
    """A NULL-terminated override array for `llama_model_params.tensor_buft_overrides`. llama.cpp reads
    it (and the pattern strings it points to) only while the model loads: keep this object alive
    until `llama_model_load_from_file` returns."""

    array: ctypes.Array[_Override]
    pattern: bytes

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def cpu_buffer_type() -> int:
    """The CPU device's own buffer type (ggml_backend_cpu_buffer_type, reached through the device list
    so that only ggml-base's device API is needed)."""
    lib = ggml_lib()
    if lib is None or not hasattr(lib, "ggml_backend_dev_by_type"):
        raise EngineError(
            "this llama.cpp build does not export ggml's device functions, so the output layer cannot "
            "be kept on this machine",
            "reinstall specchat's build (`make install`)",
        )
    by_type, buft = lib.ggml_backend_dev_by_type, lib.ggml_backend_dev_buffer_type
    by_type.restype, by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    buft.restype, buft.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    dev = by_type(_CPU_DEVICE)
    found = buft(dev) if dev else None
    if not found:
        raise EngineError("llama.cpp lists no CPU device, so the output layer has nowhere to stay here")
    return int(found)


def local_output_overrides() -> Overrides:
    """The override that keeps the output layer on this machine's CPU (see the module's docstring)."""
    pattern = OUTPUT_LAYER_PATTERN.encode()
    array = (_Override * 2)(_Override(pattern, cpu_buffer_type()), _Override(None, None))
    return Overrides(array=array, pattern=pattern)
