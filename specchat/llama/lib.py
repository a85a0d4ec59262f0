"""llama-cpp-python, imported once for the package: a build whose shared libraries do not load is one
clear line (`EngineError`) for every command that needs llama.cpp, not a traceback."""

from __future__ import annotations

from ..errors import EngineError

__all__ = ["library_load_failure", "llama_cpp"]


def library_load_failure(exc: BaseException) -> EngineError:
    """One line for a llama-cpp-python whose shared libraries do not load (raised at import, so every
    command that needs llama.cpp says it, not a traceback): most often a CUDA build on a machine
    without the NVIDIA driver or CUDA's runtime libraries on the library path."""
    detail = str(exc).rsplit("': ", 1)[-1].strip() or type(exc).__name__
    if any(lib in detail for lib in ("libcuda", "libcublas", "libcudart", "libnvrtc")):
        hint = (
            "this llama-cpp-python is a CUDA build: install the NVIDIA driver and put CUDA's runtime "
            "libraries (cudart, cuBLAS) on LD_LIBRARY_PATH, or rebuild for the CPU: `make install` "
            "without CMAKE_ARGS"
        )
    else:
        hint = "reinstall it (`make install`); `specchat doctor` shows the build"
    return EngineError(
        f"llama-cpp-python is installed but its llama.cpp libraries do not load: {detail}", hint
    )


try:
    import llama_cpp
except (OSError, RuntimeError) as _exc:  # the package is there, its shared libraries are not usable
    raise library_load_failure(_exc) from _exc
