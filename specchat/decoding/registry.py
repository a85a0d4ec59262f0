"""Model-free drafters by the name users give them (`--draft ngram`): the one place that names them.

A drafter that runs a model is given as a model reference (alias, path, `hf:...`) and the loader
wraps it in ModelDrafter; a name found here is built by its factory instead. The loader, the
command-line options (`--draft`'s help lists these entries), the bench and its exports all read this
table, so a new model-free drafter is its own module plus one entry here (docs/extending.md).

Imports only the standard library: `--draft`'s help is written from this table when the command
line starts, and `specchat --help` must stay instant, so a drafter's module (numpy and all) is
imported only when one is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .drafters import Drafter

#: the n-gram prompt-lookup drafter's name on the command line and in requests' logs
NGRAM = "ngram"


@dataclass(frozen=True, slots=True)
class ModelFree:
    """A model-free drafter: its name, where its class is, and a line for --help."""

    name: str
    #: "module:Class" under specchat.decoding; the class is built with no arguments
    factory: str
    help: str

    def make(self) -> Drafter:
        module, _, cls = self.factory.partition(":")
        drafter: Drafter = getattr(importlib.import_module(f".{module}", __package__), cls)()
        return drafter


MODEL_FREE: Mapping[str, ModelFree] = MappingProxyType(
    {
        NGRAM: ModelFree(NGRAM, "drafters:NgramDrafter", "prompt lookup: copies what the context repeats"),
        "answers": ModelFree(
            "answers", "answers:AnswersDrafter", "earlier answers: drafts where an answer repeats one"
        ),
    }
)


#: the name of the target's own multi-token-prediction drafter: its NextN layers (Qwen3.5 and later, GLM,
#: MiMo...) or, for Gemma 4, the assistant model the registry names beside it. Not model-free: it runs
#: on the target's weights and hidden states, so the loader builds it with the target (llama/mtp.py)
MTP = "mtp"
MTP_HELP = "the model's own multi-token-prediction head, where its GGUF has one"


def is_target_head(spec: str) -> bool:
    """Whether `--draft spec` names the target's own drafter rather than a model or a model-free one."""
    return spec == MTP


def is_model_free(spec: str) -> bool:
    """Whether `--draft spec` names a model-free drafter rather than a model to load."""
    return spec in MODEL_FREE


def make(spec: str) -> Drafter:
    """A new drafter for a model-free name (KeyError for anything else: check is_model_free)."""
    return MODEL_FREE[spec].make()


def described() -> str:
    """The model-free drafters and the model's own head as `--draft`'s help names them:
    "`ngram` (prompt lookup: ...), ..."."""
    return ", ".join([*(f"`{m.name}` ({m.help})" for m in MODEL_FREE.values()), f"`{MTP}` ({MTP_HELP})"])
