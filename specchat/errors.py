"""Domain errors. Each carries one line for the user: what is wrong and how to fix it.

The CLI turns any `SpecchatError` into that single line on stderr and a non-zero exit; tracebacks are
shown only with `--verbose`. Library code raises these instead of printing, so it stays testable.
"""

from __future__ import annotations


class SpecchatError(Exception):
    """Base class: `str(err)` is the one-line message shown to the user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)


class BadInput(SpecchatError):
    """An option value or argument that cannot be used (bad numbers, unknown references)."""

    exit_code = 2


class ModelNotFound(SpecchatError):
    """A model reference that names no file, alias or Hub entry."""

    exit_code = 2


class ModelFileError(SpecchatError):
    """A file that exists but is not a loadable GGUF (text file, truncated download, ...)."""


class IncompatiblePair(SpecchatError):
    """Draft and target tokenizers disagree on ordinary tokens, so drafts would be meaningless."""


class ContextFull(SpecchatError):
    """The prompt (or conversation) does not fit in the context window."""


class OfflineError(SpecchatError):
    """A model is needed from the network while offline, or the network is unreachable."""


class DownloadError(SpecchatError):
    """A download failed, was cut, or produced a file that does not match its checksum."""


class NotEnoughMemory(SpecchatError):
    """The fit check found the pair will not fit in RAM/VRAM."""


class EngineError(SpecchatError):
    """llama.cpp reported a failure (decode error, allocation failure)."""


class WorkerError(SpecchatError):
    """An RPC worker (`--rpc`) that cannot be reached, refuses the handshake or speaks another version."""
