"""Which llama-cpp-python is installed: specchat's patched build (`make install`, `llama/build.py`) or a
stock one (`pip install .` or `pip install specchat` alone), told apart by the version alone.

Why it matters: the patched build makes verify batches round like one-token decoding; on a stock build
specchat still works, and keeps its exactness promise under `--strict`, but drafts gain less. So a
stock build is never used silently: every model load warns in one line which build it is and how to
get the patched one (`Installed.warning`, which also says why that is a warning and not a refusal),
and `specchat doctor` shows it (`Installed.line`).

Standard library only, like build.py: it reads package metadata and the patch files, never llama_cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import build, patchqueue

#: How to get the patched build, as every message that finds a stock one says it
INSTALL_HINT = (
    "get specchat's patched build with `make install` in the specchat checkout "
    "(or `python -m specchat.llama.build install` from its root)"
)


def known_queues(patches: Sequence[Path]) -> frozenset[str]:
    """The queue hashes a build from this checkout may carry: the whole queue (a Metal build) and
    the queue less its Metal patch (every other build, and a Metal build that fell back)."""
    if not patches:
        return frozenset()
    return frozenset(build.queue_hash(patchqueue.for_build(patches, metal)) for metal in (True, False))


@dataclass(frozen=True)
class Installed:
    """Which llama-cpp-python is installed, as its version says: specchat's patched build carries
    `+specchat.<queue hash>` (`build.local_version`), a stock one none. `current` holds the queue hashes
    this checkout builds (empty outside a checkout: then a patched build cannot be called stale)."""

    version: str | None
    current: frozenset[str] = frozenset()

    @property
    def queue(self) -> str | None:
        """The patch queue the installed build holds; None when it is stock (or not installed)."""
        return build.installed_queue(self.version) if self.version else None

    @property
    def kind(self) -> str:
        """Which build it is: "patched", "patched, another queue" (built from another checkout's
        patches), "stock" or "not installed"."""
        if self.version is None:
            return "not installed"
        if self.queue is None:
            return "stock"
        return "patched, another queue" if self.current and self.queue not in self.current else "patched"

    def line(self) -> str:
        """What doctor shows: the version and which build it is."""
        name = f"{build.PACKAGE} {self.version}"
        if self.version is None:
            return f"{build.PACKAGE} is not installed"
        pinned = "" if self.version.split("+", 1)[0] == build.PINNED else f"; specchat pins {build.PINNED}"
        if self.kind == "stock":
            return f"stock {name} (no llama.cpp patch queue{pinned})"
        if self.kind == "patched":
            return f"patched {name} (specchat's llama.cpp patch queue {self.queue}{pinned})"
        ours = " or ".join(sorted(self.current))
        return f"patched {name}, with another patch queue than this checkout's ({ours})"

    def advice(self) -> str | None:
        """What a build other than this checkout's patched one means and what to do about it (None for
        that build)."""
        if self.kind == "not installed":
            return INSTALL_HINT
        if self.kind == "stock":
            return (
                "its verify batches are bit-exact for a few rows at most, so drafting gains less and, "
                f"without --strict, a near-tie may part from --no-draft; {INSTALL_HINT}"
            )
        if self.kind == "patched, another queue":
            return "run `make install` in the checkout to rebuild it with this checkout's patches"
        return None

    def warning(self) -> str | None:
        """One line for a load on a build that is not this checkout's patched one (None when it is).

        A warning, not a refusal, on every path, the exactness-critical ones included. The patched
        build makes verify batches round like one-token decoding; exactness does not rest on it
        alone. On a stock build the target's bit-exact batch is measured at load, rows of wider
        batches decide a token only outside the tie margin, and `--strict` (the path whose promise is
        token-for-token equality with `--no-draft`) verifies within the bit-exact batch, so its
        promise holds on a stock build too, at some speed. What a stock build loses is speed, and,
        without `--strict`, a true near-tie after a long batch may go either way (docs/exactness.md),
        which the warning says. Refusing would also leave no build at all where the queue cannot be
        built (a `pip install specchat` without a checkout, CUDA and Metal wheels). Only a build that
        failed its self-check, and would crash or compute garbage, is refused
        (buildcheck.refuse_known_bad)."""
        advice = self.advice()
        return None if advice is None else f"{self.line()}: {advice}"


def describe(version: str | None, *, root: Path | None = None) -> Installed:
    """The build whose llama-cpp-python version is `version` (None: not installed), compared with
    this checkout's patch queue. Reads the patch files only: nothing is imported or built."""
    return Installed(version, known_queues(build.patch_queue(root)))
