"""The sampling settings, each described once: name, type, default, range, command-line flag and help.

The table is `SamplingParams` itself: every field is declared with `setting(...)`, which stores the
rest of its description in the field's metadata, and `SETTINGS` lists them in field order. Everything
else reads it:

- `specchat run`, `chat` and `serve` get one option per setting (`cli/options.py`'s
  `sampling_options` writes the Typer parameters from `SETTINGS`, so `--help` shows the flag, help line
  and default as a hand-written option would) and hand the command one `SamplingParams`;
- the HTTP request parser (`server/api.py`) reads the field of the same name from the body, checks its
  JSON type against the setting's type, and takes `serve`'s `SamplingParams` for what is left out;
- the server's worker and the terminal chat pass that `SamplingParams` on as it is.

Types and ranges are checked in one place: `SamplingParams.__post_init__`, so no `SamplingParams` of
the wrong type or out of range exists. An integer setting takes an integer (not a bool, not 2.5, not
2.0: a float there is a mistake the caller should hear about, not a value to round), a number setting
any real number but a bool (an int or numpy scalar held as a float, so equal settings hash alike), and
NaN and infinities are out of every range. The command line and the HTTP parser hand over values of
the right type already; the Python API hands over what its caller wrote, so this is where `top_k=2.5`
is refused rather than failing later inside the sampler. It raises `SettingError`, which each caller
words with its own name for the setting: the flag on the command line (`--top-p must be in (0, 1]
...`), the field in an HTTP 400 (`param: top_p`), the keyword in the Python API.
Token ids are checked against a vocabulary once one is loaded (`SamplingParams.check_vocab`).

Most settings are one number. A per-token setting (`logit_bias`) maps token ids to numbers: declared
with `per_token(...)`, held as sorted `(id, value)` pairs (so `SamplingParams` stays frozen and
hashable), given as `ID=VALUE` pairs on the command line (`--logit-bias 15=-100,42=5`, repeatable)
and as a JSON object over HTTP (`{"15": -100}`, OpenAI's form); its range is each value's.

The settings that need the tokens generated so far (the penalties, the bias) reach the target's and
the drafts' rows through `processors.py`'s logits processors, built from this table by the loop;
`support()` in sampling.py handles the rest.

Why the dataclass's fields are the table, rather than a list of entries from which the class is built:
the sampler, the drafters and the tests read `params.top_p` as a plain typed attribute, and a class made
at run time (`make_dataclass`) would hide its fields from readers, editors and linters. So a new
setting is one `setting(...)` line here plus its use in `sampling.support()` (or, for one that needs
the answer so far, in `processors.for_params`); nothing else changes.

Not in the table: `seed` and `max_tokens`. They never reach the distribution, their defaults differ by
command (`run` 256 tokens, `chat` 512, `serve` until the context is full, the bench 128) and the API has
its own forms of them (`max_completion_tokens`, `max_tokens` 0 with `echo`); they stay with each command.
Two defaults that several layers share are named below, each written once: `CTX_SIZE` (every command's
`--ctx-size`, `cli.options.Options`, `models.loader.LoadConfig`, `llama.engine.LoadOptions`) and
`MAX_TOKENS` (`run`'s `--max-tokens`, `Options`, `loop.Settings`, `session.ChatSession`). They live here
because this is the lowest layer every reader may import (the CLI and the loader above, the engine
between) and it imports nothing heavy.

Imports only the standard library: the CLI builds its options from this module at start-up, and
`specchat --help` must stay instant.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, TypeGuard, TypeVar

T = TypeVar("T", int, float)

_KEY = "specchat.setting"

#: A per-token setting's value: (token id, value) pairs, ids ascending and each once.
TokenMap = tuple[tuple[int, float], ...]
#: What a per-token setting may be given as: a mapping from id to value, or the pairs themselves.
TokenMapLike = Mapping[int, float] | Iterable[tuple[int, float]]

#: The context window (prompt + output, in tokens) a model is loaded with when nothing says otherwise
CTX_SIZE = 4096
#: Tokens an answer may run to when nothing says otherwise (`run`'s default; not `chat`'s, `serve`'s or
#: the bench's, which differ on purpose: see the module docstring)
MAX_TOKENS = 256

#: side branches a target's context makes room for (llama.engine.LoadOptions.tree_branches, the
#: most `--tree-width` takes): each is one more llama.cpp sequence of a unified cache
TREE_BRANCHES = 8
#: `--tree-width` under -k auto: side nodes a round may have, each added only where the planner's
#: price of its verify row says it pays (decoding/tree.py)
AUTO_TREE_WIDTH = 4
#: `--draft-window`: recent tokens a draft model attends to besides the context's first few
#: (llama/window.py; 0: the whole context)
DRAFT_WINDOW = 1024


@dataclass(frozen=True, slots=True)
class Range:
    """Allowed values: >= lo (> lo when `lo_open`), and <= hi (< hi when `hi_open`) when hi is given."""

    lo: float
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not isinstance(value, int) and not math.isfinite(value):  # an int may be too big for a float
            return False
        if value < self.lo or (self.lo_open and value == self.lo):
            return False
        return self.hi is None or value < self.hi or (not self.hi_open and value == self.hi)

    def __str__(self) -> str:
        """As a message says it: `>= 0`, `> 0`, `in (0, 1]`, `in [0, 1)`."""
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


@dataclass(frozen=True, slots=True)
class Setting:
    """One sampling setting. `name` is the `SamplingParams` field and the HTTP body's field (OpenAI's
    and llama-server's names); `flag` the command-line option; `off` the value that disables it, if
    one does (said in the error, so the user learns how to turn it off). `type` is `tuple` for a
    per-token setting (a `TokenMap`, whose values `range` bounds)."""

    name: str
    type: type[int] | type[float] | type[tuple[Any, ...]]
    default: int | float | TokenMap
    range: Range
    flag: str
    help: str
    off: int | float | None = None

    @property
    def per_token(self) -> bool:
        """Whether the setting maps token ids to numbers (given as ID=VALUE pairs)."""
        return self.type is tuple

    def held(self, value: Any) -> int | float | TokenMap:
        """`value` as `SamplingParams` holds it -- an int, a float, or sorted (id, value) pairs -- once
        its type and range are checked (NaN and infinities are never in range; a per-token setting's
        ids must be integers >= 0 and its values in range); SettingError saying what it takes."""
        if self.per_token:
            return self.token_map(value)
        if self.type is int:
            if not is_integer(value):
                raise SettingError(self, value, f"must be an integer {self.range} (got {shown(value)})")
            value = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise SettingError(self, value, f"must be a number {self.range} (got {shown(value)})")
            value = float(value)
        if value not in self.range:
            raise SettingError(self, value)
        return value

    def _check_pairs(self, pairs: TokenMap) -> None:
        for token, v in pairs:
            if not is_integer(token) or token < 0:
                raise SettingError(self, token, f"token ids must be integers >= 0 (got {token!r})")
            if v not in self.range:
                raise SettingError(self, v, f"values must be {self.range} (got {v:g} for token {token})")

    def token_map(self, value: TokenMapLike) -> TokenMap:
        """A per-token value as `SamplingParams` holds it: sorted pairs, the last value of an id
        given twice winning; SettingError when it is not id-number pairs at all."""
        try:
            pairs = list(value.items() if isinstance(value, Mapping) else value)
            merged = {
                int(token) if is_integer(token) else token: float(v)
                for token, v in pairs
                if not isinstance(v, bool) and isinstance(v, numbers.Real)
            }
        except (TypeError, ValueError):
            raise SettingError(self, 0, "must map token ids to numbers") from None
        if len(merged) != len({token for token, _ in pairs}):
            raise SettingError(self, 0, "must map token ids to numbers")
        out = tuple(sorted(merged.items(), key=lambda kv: kv[0] if is_integer(kv[0]) else -1))
        self._check_pairs(out)
        return out

    def parse_pairs(self, texts: Iterable[str]) -> TokenMap:
        """A per-token value from the command line: `ID=VALUE` pairs, comma-separated and/or one
        per repeated flag; SettingError naming the pair that is not one."""
        pairs: list[tuple[int, float]] = []
        for text in texts:
            for item in text.split(","):
                token, eq, v = item.partition("=")
                try:
                    if not eq:
                        raise ValueError(item)
                    pairs.append((int(token.strip()), float(v.strip())))
                except ValueError:
                    raise SettingError(self, 0, f"takes ID=VALUE pairs (got {item.strip()!r})") from None
        return self.token_map(pairs)


def is_integer(value: object) -> TypeGuard[int]:
    """An integer, numpy's included (they register as `numbers.Integral`), but not a bool: True is 1
    to Python, but `top_k=True` is a mistake."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def shown(value: object) -> str:
    """A value of the wrong type as a message quotes it: its repr, cut short (it may be anything)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class SettingError(ValueError):
    """A setting of the wrong type or out of range. `str()` names the flag; `line(label)` words it for
    another caller. `problem` says what is wrong where "must be in RANGE (got VALUE)" would not (a
    token id, a value that is not a number)."""

    def __init__(self, setting: Setting, value: object, problem: str | None = None) -> None:
        self.setting = setting
        self.value = value
        self.problem = problem
        super().__init__(self.line(setting.flag))

    def line(self, label: str) -> str:
        """The one-line reason, naming the setting as `label` (a flag, an HTTP field, a chat command)."""
        if self.problem is not None:
            return f"{label} {self.problem}"
        off = f"; {self.setting.off:g} disables it" if self.setting.off is not None else ""
        return f"{label} must be {self.setting.range} (got {self.value:g}){off}"


def setting(
    default: T,
    *,
    help: str,
    lo: float,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    flag: str | None = None,
    off: T | None = None,
) -> T:
    """Declare a `SamplingParams` field with its description (the flag defaults to --the-name)."""
    spec = {"range": Range(lo, hi, lo_open, hi_open), "help": help, "flag": flag, "off": off}
    return field(default=default, metadata={_KEY: spec})


def per_token(*, help: str, lo: float, hi: float, flag: str | None = None) -> tuple[tuple[int, float], ...]:
    """Declare a per-token `SamplingParams` field: token ids to values in [lo, hi], none by default."""
    spec = {"range": Range(lo, hi), "help": help, "flag": flag, "off": None}
    return field(default=(), metadata={_KEY: spec})  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the next token is drawn; the table of sampling settings (see the module docstring).

    Applied identically to the target's p and every draft's q (sampling.probs), which exact
    verification requires. Temperature 0 means greedy, and then the filters do not matter.
    """

    temperature: float = setting(
        0.0, flag="--temp", lo=0.0, help="Sampling temperature; 0 = greedy (deterministic)."
    )
    top_k: int = setting(40, lo=0, off=0, help="Sample from the k most likely tokens (0 = off).")
    top_p: float = setting(
        0.95, lo=0.0, lo_open=True, hi=1.0, off=1.0, help="Nucleus sampling mass in (0, 1] (1 = off)."
    )
    min_p: float = setting(
        0.0,
        lo=0.0,
        hi=1.0,
        hi_open=True,
        off=0.0,
        help="Drop tokens less likely than this fraction of the likeliest one, in [0, 1) (0 = off).",
    )
    presence_penalty: float = setting(
        0.0,
        lo=-2.0,
        hi=2.0,
        off=0.0,
        help="Lower the logit of every token the answer already holds by this, in [-2, 2] (0 = off).",
    )
    frequency_penalty: float = setting(
        0.0,
        lo=-2.0,
        hi=2.0,
        off=0.0,
        help="Lower a token's logit by this times its count in the answer so far, in [-2, 2] (0 = off).",
    )
    logit_bias: tuple[tuple[int, float], ...] = per_token(
        lo=-100.0,
        hi=100.0,
        help="Add to token ids' logits: ID=BIAS pairs, comma-separated or repeated; BIAS in "
        "[-100, 100] (-100 bans a token, 100 forces it).",
    )

    def __post_init__(self) -> None:
        for s in SETTINGS:
            # held as the setting's own type: a per-token mapping as sorted pairs, 1 as 1.0 where a
            # float is meant (so equal settings compare and hash alike)
            object.__setattr__(self, s.name, s.held(getattr(self, s.name)))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def check_vocab(self, n_vocab: int) -> None:
        """SettingError for a per-token setting naming a token id the vocabulary lacks: checked
        once a model is loaded (the table alone cannot know its size)."""
        for s in SETTINGS:
            if s.per_token:
                for token, _ in getattr(self, s.name):
                    if token >= n_vocab:
                        problem = f"names token {token}, beyond the vocabulary (ids 0-{n_vocab - 1})"
                        raise SettingError(s, token, problem)


def _described(f: Field[Any]) -> Setting:
    spec = f.metadata[_KEY]
    kind = type(f.default)
    assert kind in (int, float, tuple), f"setting {f.name}: the default's type must be int, float or ()"
    flag = spec["flag"] or "--" + f.name.replace("_", "-")
    return Setting(f.name, kind, f.default, spec["range"], flag, spec["help"], spec["off"])  # type: ignore[arg-type]


#: Every sampling setting, in `SamplingParams`'s field order (the order of the CLI options too).
SETTINGS: tuple[Setting, ...] = tuple(_described(f) for f in fields(SamplingParams))
