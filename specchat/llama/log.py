"""llama.cpp's own log: dropped unless --verbose (it is noise for users otherwise), and the lines some
backends print on fd 2 directly while loading, bypassing the log callback."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

from .lib import llama_cpp


def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


def _stderr_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    sys.stderr.write(text.decode("utf-8", errors="replace"))
    sys.stderr.flush()


# kept referenced for the process's lifetime: llama.cpp calls them from C
_SILENT_LOG = llama_cpp.llama_log_callback(_silent_log)
_STDERR_LOG = llama_cpp.llama_log_callback(_stderr_log)


def set_verbose(verbose: bool) -> None:
    """Route llama.cpp's own log to stderr (verbose) or drop it; it is noise for users otherwise.
    (The binding wants a callback either way: a NULL one is rejected by ctypes.)"""
    llama_cpp.llama_log_set(_STDERR_LOG if verbose else _SILENT_LOG, ctypes.c_void_p(0))


@contextlib.contextmanager
def quiet_stderr(enabled: bool) -> Iterator[None]:
    """Some backends print on fd 2 directly during load, bypassing the log callback."""
    if not enabled:
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
