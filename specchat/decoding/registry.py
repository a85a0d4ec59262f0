"""Model-free drafters by the name users give them (`--draft ngram`): the one place that names them.

A drafter that runs a model is given as a model reference (alias, path, `hf:...`) and the loader
wraps it in ModelDrafter; a name found here is built by its factory instead. The loader, the
command-line options, the bench and its exports all read this table, so a new model-free drafter is
its own module plus one entry here (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .drafters import Drafter, NgramDrafter

#: the n-gram prompt-lookup drafter's name on the command line and in requests' logs
NGRAM = "ngram"


@dataclass(frozen=True, slots=True)
class ModelFree:
    """A model-free drafter: its name, how to build one, and a line for --help."""

    name: str
    make: Callable[[], Drafter]
    help: str


MODEL_FREE: Mapping[str, ModelFree] = MappingProxyType(
    {
        NGRAM: ModelFree(NGRAM, NgramDrafter, "model-free prompt lookup (copies what the context repeats)"),
    }
)


def is_model_free(spec: str) -> bool:
    """Whether `--draft spec` names a model-free drafter rather than a model to load."""
    return spec in MODEL_FREE


def make(spec: str) -> Drafter:
    """A new drafter for a model-free name (KeyError for anything else: check is_model_free)."""
    return MODEL_FREE[spec].make()
