"""Model-free drafters by the name users give them (`--draft ngram`): the one place that names them.

A drafter that runs a model is given as a model reference (alias, path, `hf:...`) and the loader
wraps it in ModelDrafter; a name found here is built by its factory instead. The loader, the
command-line options (`--draft`'s help lists these entries), the default drafters of every command
(`default` entries), the bench and its exports all read this table, so a new model-free drafter is
its own module plus one entry here (docs/extending.md).

A drafter is configured where it is named: `--draft ngram:max_n=12,min_n=3` builds the n-gram
drafter with `max_n=12, min_n=3`. The options are its constructor's keyword parameters (each with a
default of type bool, int, float or str, which says how its text is read); an unknown option or a
value the constructor refuses is one line naming the drafter and what it takes. A drafter given
options is named by its whole spec in the stats, so two differently configured ones stay apart.

Imports only the standard library: `--draft`'s help is written from this table when the command
line starts, and `specchat --help` must stay instant, so a drafter's module (numpy and all) is
imported only when one is built.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..errors import BadInput

if TYPE_CHECKING:
    from .drafters import Drafter

#: the n-gram prompt-lookup drafter's name on the command line and in requests' logs
NGRAM = "ngram"
#: how `--draft` writes a model-free drafter with options
FORM = "NAME:key=value[,key=value]"
#: what a text option value may say for true and for false
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: constructor parameters set for the drafter, never options: its name in the stats (the spec) and
#: the side branches of its token trees (`--tree-width`, one setting for every drafter)
_RESERVED = ("name", "tree_width")


@dataclass(frozen=True, slots=True)
class ModelFree:
    """A model-free drafter: its name, where its class is, a line for --help, and whether every
    command uses it when the user names no drafter."""

    name: str
    #: "module:Class" under specchat.decoding; its keyword parameters with defaults are the options
    factory: str
    help: str
    #: among the drafters `run`, `chat`, `serve` and `bench` use when none is named (`defaults()`)
    default: bool = False

    def options(self) -> dict[str, object]:
        """The options this drafter takes, with their defaults (its constructor's parameters)."""
        params = inspect.signature(self._class()).parameters.values()
        return {
            p.name: p.default
            for p in params
            if p.default is not inspect.Parameter.empty
            and p.name not in _RESERVED
            and isinstance(p.default, bool | int | float | str)
        }

    def make(self, tree_width: int = 0, /, **options: object) -> Drafter:
        """A new drafter built with `options` (text values, as `--draft` gives them, are read as the
        option's type). BadInput naming the drafter for an unknown option or a refused value.
        `tree_width` (positional, so an option of that name is refused as unknown): the side
        branches of its token trees, where it offers trees at all."""
        takes = self.options()
        given = {}
        for key, value in options.items():
            if key not in takes:
                raise BadInput(
                    f"drafter {self.name} has no option {key!r}",
                    f"it takes {', '.join(f'{k}={v}' for k, v in takes.items()) or 'none'} (--draft {FORM})",
                )
            given[key] = _converted(self.name, key, value, takes[key])
        if tree_width and "tree_width" in inspect.signature(self._class()).parameters:
            given["tree_width"] = tree_width
        try:
            drafter: Drafter = self._class()(**given)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"drafter {self.name}: {exc}", f"--draft {FORM}") from None
        return drafter

    def _class(self) -> type:
        module, _, cls = self.factory.partition(":")
        found: type = getattr(importlib.import_module(f".{module}", __package__), cls)
        return found


def _converted(drafter: str, key: str, value: object, default: object) -> object:
    """`value` as the type of the option's default; BadInput when it cannot be read as one."""
    kind = type(default)
    if not isinstance(value, str):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if type(value) is kind:
            return value
    text = str(value).strip()
    try:
        if kind is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        return kind(text)
    except ValueError:
        what = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "text")
        raise BadInput(f"drafter {drafter}: {key} must be {what} (got {text!r})", f"--draft {FORM}") from None


MODEL_FREE: Mapping[str, ModelFree] = MappingProxyType(
    {
        NGRAM: ModelFree(
            NGRAM, "ngram:NgramDrafter", "prompt lookup: copies what the context repeats", default=True
        ),
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
#: the name of an EAGLE-3 head trained for the target (`eagle3:head=PATH`, the registry's `eagle3`, or
#: an `eagle3-*.gguf` beside the target): a file of its own that reads three of the target's layers,
#: so the loader builds it with the target too (llama/eagle3.py)
EAGLE3 = "eagle3"
EAGLE3_HELP = "an EAGLE-3 head trained for the model: eagle3:head=PATH, or found beside it"
#: the name of a DFlash block drafter trained for the target (`dflash:model=PATH`, or a `dflash-*.gguf`
#: beside the target): a file of its own that reads several of the target's layers and proposes a
#: whole block in one pass, so the loader builds it with the target too (llama/dflash.py)
DFLASH = "dflash"
DFLASH_HELP = "a DFlash block drafter trained for the model: dflash:model=PATH, or found beside it"
#: a DSpark drafter: a DFlash drafter with a Markov head (`dspark:model=PATH`, or a `dspark-*.gguf`)
DSPARK = "dspark"
DSPARK_HELP = "a DSpark block drafter (DFlash with a Markov head): dspark:model=PATH"
#: the block drafters among them (llama/dflash.py)
BLOCK_DRAFTERS = (DFLASH, DSPARK)
#: the drafters that read the target's hidden states; a run has at most one of them
TARGET_HEADS = (MTP, EAGLE3, *BLOCK_DRAFTERS)


def is_target_head(spec: str) -> bool:
    """Whether `--draft spec` names a drafter that reads the target's hidden states (its MTP head, an
    EAGLE-3 head) rather than a model or a model-free one."""
    return spec.partition(":")[0] in TARGET_HEADS


def split(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME:key=value,key=value` as the drafter's name and its options (text values, not checked
    against the drafter: `make` does that); BadInput for a malformed list."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in rest.split(",") if rest.strip() else ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise BadInput(f"--draft {spec}: {item.strip()!r} is not key=value", f"write --draft {FORM}")
        options[key.strip()] = value.strip()
    return name, options


def is_model_free(spec: str) -> bool:
    """Whether `--draft spec` names a model-free drafter (with or without options) rather than a
    model to load."""
    return spec.partition(":")[0] in MODEL_FREE


def make(spec: str, *, tree_width: int = 0) -> Drafter:
    """A new drafter for a model-free spec, `NAME` or `NAME:key=value,...` (KeyError for a name not
    in the table: check is_model_free). One given options is named by its whole spec. `tree_width`:
    side branches its token trees may have (`--tree-width`), where it offers trees."""
    name, options = split(spec)
    drafter = MODEL_FREE[name].make(tree_width, **options)
    if options:
        drafter.name = spec
    return drafter


def defaults() -> tuple[str, ...]:
    """The model-free drafters every command uses when the user names none, in the table's order."""
    return tuple(m.name for m in MODEL_FREE.values() if m.default)


def described() -> str:
    """The model-free drafters and the heads that read the target as `--draft`'s help names them:
    "`ngram` (prompt lookup: ...), ..."."""
    heads = (
        f"`{MTP}` ({MTP_HELP})",
        f"`{EAGLE3}` ({EAGLE3_HELP})",
        f"`{DFLASH}` ({DFLASH_HELP})",
        f"`{DSPARK}` ({DSPARK_HELP})",
    )
    return ", ".join([*(f"`{m.name}` ({m.help})" for m in MODEL_FREE.values()), *heads])
