"""specchat: exact speculative decoding for local GGUF models on llama.cpp.

As a library (`api.py`; docs/python-api.md):

    import specchat

    model = specchat.load("qwen2.5-coder-1.5b")
    print(specchat.generate(model, "Write a haiku about caches."))

Importing the package imports nothing heavy (llama_cpp, numpy and the Hub client load with the
first model), so `specchat --help` stays instant. `__version__` is the installed distribution's
version, read from its metadata, so pyproject.toml's `version` is the one place it is written; a
checkout imported without being installed reports `0+unknown` rather than a number that may be stale.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .api import LoadedModel, Piece, Result, Stream, generate, load, stream

try:
    __version__ = version("specchat")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["LoadedModel", "Piece", "Result", "Stream", "__version__", "generate", "load", "stream"]
