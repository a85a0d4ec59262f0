"""specchat: exact speculative decoding for local GGUF models on llama.cpp.

`__version__` is the installed distribution's version, read from its metadata, so pyproject.toml's
`version` is the one place it is written; a checkout imported without being installed reports
`0+unknown` rather than a number that may be stale.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specchat")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
