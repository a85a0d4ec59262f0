"""specchat as a Python library: load a target and its drafters once, then generate or stream answers.

    import specchat

    with specchat.load("qwen2.5-coder-1.5b") as model:       # + its recommended draft and n-gram lookup
        print(specchat.generate(model, "Write a haiku about caches."))
        for piece in specchat.stream(model, "Count to five.", temperature=0.7, seed=1):
            print(piece.text, end="", flush=True)              # piece.source: draft, ngram, target, ...

A thin face over what `specchat run` does, never a second path through the loop: `load` is
`models.loader.load` (the same checks, fit test and calibration), each answer goes through the
target's chat template (`loader.chat_prompt`) and `decoding.session.answer_events`, the loop every
front end uses, with the planner `run` builds (kept across answers, as the chat keeps it, or built
from the seed for a seeded answer, as the server does). The settings are the CLI's, by their Python
names: `load`'s keyword arguments are `run`'s options (`draft`, `k`, `ctx_size`, ...) and the
defaults of the sampling settings (decoding/settings.py: `temperature`, `top_p`, `presence_penalty`,
`logit_bias`, ...), which each answer may override.

Nothing heavy is imported until `load` is called: `import specchat` stays as quick as `specchat --help`.
Bad settings raise ValueError naming the keyword and what it takes, at the call: every keyword is
checked for its type as well as its range before anything loads or decodes (`top_k=2.5`, `k=True`,
`temperature="0.7"`, NaN), because a value of the wrong type would otherwise travel into the loader or
the sampler and fail there, far from the mistake, or not fail at all. The sampling settings are
checked by their table (decoding/settings.py), the other keywords here. What the CLI reports as one
line (a model that cannot be found or does not fit, ...) raises the same `specchat.errors.SpecchatError`.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .decoding.settings import (
    AUTO_TREE_WIDTH,
    CTX_SIZE,
    DRAFT_WINDOW,
    MAX_TOKENS,
    TREE_BRANCHES,
    SamplingParams,
    SettingError,
    is_integer,
    shown,
)

if TYPE_CHECKING:
    from .decoding.events import Event, Stats
    from .decoding.loop import Planner, Tally
    from .decoding.processors import LogitsProcessor
    from .models.loader import LoadedEngine

#: `k` values: a number of draft tokens per round (0 = none), or None for the cost model's choice
K_MAX = 64


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of an answer's text and where its token came from: `source` is "draft", "ngram" or
    "mtp" (proposed by a drafter and accepted; "mtp" by a head that reads the target, its MTP head
    or an EAGLE-3 head), "correction" (the target's token where a draft was wrong),
    "bonus" (the target's extra token after a fully accepted draft) or "target" (plain decoding).
    `text` may be "" for a token that ends inside a multi-byte character (the next carries it)."""

    text: str
    source: str
    token: int
    drafter: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A whole answer: its text, tokens and their sources, and the run's statistics (tokens per
    second, acceptance, ... as `specchat run --json` reports them). `str(result)` is the text."""

    text: str
    tokens: tuple[int, ...]
    sources: tuple[str, ...]
    stats: Stats

    def __str__(self) -> str:
        return self.text


@dataclass(eq=False)
class LoadedModel:
    """What `load` returns: the loaded target and drafters, and the settings each answer starts
    from. Close it (or use it as a context manager) to free the models."""

    engine: LoadedEngine
    params: SamplingParams
    k: int | None
    p_min: float | None
    #: the chat template's extra variables every answer starts from (`load`'s chat_template_kwargs)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    _planner: Planner | None = field(default=None, repr=False)
    _active: Stream | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        """The target model's file."""
        return str(self.engine.loaded.target.path)

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters' names (draft models by reference, model-free ones by spec)."""
        return tuple(d.name for d in self.engine.drafters)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What loading found worth saying (a draft of another family, ...)."""
        return tuple(self.engine.loaded.warnings)

    def close(self) -> None:
        """Stop an answer still streaming (its cleanup needs the models), then free the models."""
        if self._active is not None:
            self._active.close()
        self.engine.loaded.close()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def planner(self, seed: int | None) -> Planner:
        """The planner `run` would use: one kept across answers (it learns), or, for a seeded answer,
        one of its own from the seed, so the answer repeats."""
        if seed is not None:
            return self.engine.planner(self.k, seed=seed)
        if self._planner is None:
            self._planner = self.engine.planner(self.k)
        return self._planner


class Stream:
    """An answer as it is generated: iterate it for `Piece`s; `stats` is set once it has ended.
    Stopping early (`close()`, or leaving a `with` block) leaves the models' caches consistent."""

    def __init__(self, events: Iterator[Event], tally: Tally) -> None:
        self._events = events
        self._tally = tally
        self.stats: Stats | None = None

    def __iter__(self) -> Iterator[Piece]:
        return self

    def __next__(self) -> Piece:
        from .decoding.events import Done, Token

        for ev in self._events:
            if isinstance(ev, Token):
                return Piece(ev.text, ev.source.value, ev.id, ev.drafter)
            if isinstance(ev, Done):
                self.stats = ev.stats
        raise StopIteration

    def close(self) -> None:
        """Stop generating; `stats` then holds what was generated so far."""
        self._events.close()  # type: ignore[attr-defined]
        if self.stats is None:
            self.stats = self._tally.snapshot("interrupted")

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def load(
    target: str,
    *,
    draft: str | Sequence[str] | None = None,
    k: int | None = None,
    p_min: float | None = None,
    ctx_size: int = CTX_SIZE,
    gpu_layers: int | None = None,
    draft_gpu_layers: int | None = None,
    threads: int | None = None,
    offline: bool = False,
    force: bool = False,
    strict: bool = False,
    verbose: bool = False,
    rpc: str | Sequence[str] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tree_width: int | None = None,
    draft_window: int | None = None,
    **sampling: Any,
) -> LoadedModel:
    """Load `target` (an alias from `specchat models`, a .gguf path, hf:ORG/REPO/FILE.gguf or
    ORG/REPO:QUANT) and its drafters, as `specchat run` does.

    `draft`: a draft model (same forms), a model-free drafter (`"ngram"`, `"ngram:max_n=12"`) or a
    drafter that reads the target (`"mtp"`, `"eagle3:head=PATH"`, `"dflash:model=PATH"`), or
    several; None: the target's recommended draft model, its head if it has one and the default
    model-free drafters; `()`: none (plain decoding). `k`: draft tokens per round, None for the
    cost model's choice.
    `chat_template_kwargs`: extra variables for the chat template in every answer, as `run`'s
    --chat-template-kwargs (e.g. `{"enable_thinking": False}`). The other keywords are `run`'s
    options; `**sampling` the sampling settings' defaults for every answer.
    What `run` would print as a warning (a stock llama.cpp build rather than specchat's patched one,
    a draft of another family, ...) is a `warnings.warn` here, and stays in `LoadedModel.warnings`.
    `rpc`: llama.cpp RPC workers (`"HOST:PORT"`, a comma-separated string or a list of them) to split
    the target's layers over, as `run --rpc`; the drafters stay on this machine.
    `tree_width`: side nodes of a round's token tree at most, as `run --tree-width` (None: its
    default, 4 under the cost model and 0 with a fixed `k`).
    `draft_window`: recent tokens a draft model attends to besides the first few, as `run
    --draft-window` (None: its default; 0: the whole context).
    """
    from .decoding.drafters import default_p_min
    from .models import loader

    target = _model_ref("target", target)
    specs = None if draft is None else _specs(draft)
    params = _sampling(SamplingParams(), sampling)
    _integer("k", k, 0, K_MAX, what="a number of draft tokens", none="for the cost model's choice")
    _integer("ctx_size", ctx_size, 16)
    for name, layers in (("gpu_layers", gpu_layers), ("draft_gpu_layers", draft_gpu_layers)):
        _integer(name, layers, what="a number of layers (negative: all)", none="for the default")
    _integer("threads", threads, 1, none="for the physical cores")
    _fraction("p_min", p_min)
    _integer(
        "tree_width", tree_width, 0, TREE_BRANCHES, what="a number of side nodes", none="for the default"
    )
    _integer("draft_window", draft_window, 0, what="a number of tokens (0: all)", none=f"for {DRAFT_WINDOW}")
    variables = _template_vars(chat_template_kwargs)
    for name, flag in (("offline", offline), ("force", force), ("strict", strict), ("verbose", verbose)):
        _flag(name, flag)
    workers = _endpoints(rpc)
    drafts = loader.default_drafts(target) if specs is None else specs
    cfg = loader.LoadConfig(
        target=target,
        drafts=drafts,
        ctx_size=ctx_size,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        threads=threads,
        p_min=p_min if p_min is not None else default_p_min(params, auto=k is None),
        offline=offline or None,
        force=force,
        strict=strict,
        verbose=verbose,
        rpc=workers,
        tree_width=tree_width if tree_width is not None else (AUTO_TREE_WIDTH if k is None else 0),
        draft_window=draft_window if draft_window is not None else DRAFT_WINDOW,
    )
    loaded = loader.load(cfg)
    for line in loaded.warnings:  # what `run` prints before answering: a stock llama.cpp build, ...
        warnings.warn(line, stacklevel=2)
    return LoadedModel(loader.LoadedEngine(loaded), params, k, p_min, variables)


def stream(
    model: LoadedModel,
    prompt: str | Sequence[Mapping[str, Any]],
    *,
    system: str | None = None,
    raw: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    max_tokens: int = MAX_TOKENS,
    seed: int | None = None,
    draft: bool = True,
    logits_processors: Sequence[LogitsProcessor] = (),
    **sampling: Any,
) -> Stream:
    """Start an answer to `prompt` and return it as a `Stream` of `Piece`s.

    `prompt`: the user's message (put through the target's chat template, after `system`), or a
    whole conversation as OpenAI-style messages; `raw=True` uses a text prompt as it is.
    `chat_template_kwargs`: extra variables for the chat template, each over `load`'s (e.g.
    `{"enable_thinking": False}`: a Qwen3-family template then answers without thinking). `seed`
    makes a sampled answer repeat. `draft=False` decodes with the target alone. `**sampling`
    overrides `load`'s sampling settings for this answer. `logits_processors`: functions
    `(tokens generated so far, logits row) -> adjusted row` of your own, applied after the
    settings' to every row a token is decided from (decoding/processors.py), drafts' included,
    so the answer is still exactly the target's under them. An answer still streaming from `model`
    is stopped first: the models hold one conversation at a time.
    """
    import numpy as np

    from .decoding.loop import Tally
    from .decoding.session import answer_events, follow_temperature
    from .models.loader import chat_prompt

    if not isinstance(model, LoadedModel):
        raise ValueError(f"model must be what specchat.load returned (got {shown(model)})")
    messages = _messages(prompt, system)
    _flag("raw", raw)
    variables = {**model.template_kwargs, **_template_vars(chat_template_kwargs)}
    _integer("max_tokens", max_tokens, 1)
    _integer("seed", seed, 0, none="for a fresh draw")
    _flag("draft", draft)
    processors = _processors(logits_processors)
    params = _sampling(model.params, sampling)
    try:
        params.check_vocab(model.engine.target.n_vocab)
    except SettingError as exc:
        raise ValueError(exc.line(exc.setting.name)) from None
    if model._active is not None:
        model._active.close()
    tokens, warning = chat_prompt(model.engine.loaded.target, messages, raw=raw, template_kwargs=variables)
    if warning:  # e.g. no chat template: the prompt is used as plain text
        warnings.warn(warning, stacklevel=2)
    drafters = list(model.engine.drafters) if draft else []
    follow_temperature(drafters, model.p_min, params, auto=model.k is None)
    tally = Tally()
    events = answer_events(
        model.engine,
        tokens,
        drafters=drafters,
        planner=model.planner(seed) if drafters else None,
        params=params,
        max_tokens=max_tokens,
        rng=np.random.default_rng(seed),
        tally=tally,
        processors=processors,
    )
    model._active = Stream(events, tally)
    return model._active


def generate(
    model: LoadedModel,
    prompt: str | Sequence[Mapping[str, Any]],
    *,
    system: str | None = None,
    raw: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    max_tokens: int = MAX_TOKENS,
    seed: int | None = None,
    draft: bool = True,
    logits_processors: Sequence[LogitsProcessor] = (),
    **sampling: Any,
) -> Result:
    """The whole answer to `prompt` (see `stream` for the arguments), with its statistics."""
    answer = stream(
        model,
        prompt,
        system=system,
        raw=raw,
        chat_template_kwargs=chat_template_kwargs,
        max_tokens=max_tokens,
        seed=seed,
        draft=draft,
        logits_processors=logits_processors,
        **sampling,
    )
    with answer:
        pieces = list(answer)
    assert answer.stats is not None
    return Result(
        "".join(p.text for p in pieces),
        tuple(p.token for p in pieces),
        tuple(p.source for p in pieces),
        answer.stats,
    )


def _sampling(base: SamplingParams, given: Mapping[str, Any]) -> SamplingParams:
    """`base` with the sampling settings `given` by keyword; ValueError naming an unknown keyword or
    the keyword whose value is of the wrong type or out of range (`SamplingParams` checks both)."""
    from .decoding.settings import SETTINGS

    names = {s.name for s in SETTINGS}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(
            f"unknown setting {unknown[0]!r}; the sampling settings are {', '.join(sorted(names))}"
        )
    try:
        return replace(base, **given)
    except SettingError as exc:
        raise ValueError(exc.line(exc.setting.name)) from None


# --- the other keywords' checks: ValueError naming the keyword and what it takes ------------------------


def _integer(
    name: str,
    value: object,
    lo: int | None = None,
    hi: int | None = None,
    *,
    what: str = "an integer",
    none: str | None = None,
) -> None:
    """ValueError unless `value` is an integer in [lo, hi], or None where `none` says what None means."""
    if value is None and none is not None:
        return
    if is_integer(value) and (lo is None or value >= lo) and (hi is None or value <= hi):
        return
    bounds = f" in {lo}..{hi}" if lo is not None and hi is not None else f" >= {lo}" if lo is not None else ""
    alternative = f", or None {none}" if none is not None else ""
    raise ValueError(f"{name} must be {what}{bounds}{alternative} (got {shown(value)})")


def _fraction(name: str, value: object) -> None:
    """ValueError unless `value` is None (the default) or a number in [0, 1] (not NaN, not a bool)."""
    if value is None:
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value <= 1:
        return
    raise ValueError(f"{name} must be a number in [0, 1], or None for the default (got {shown(value)})")


def _flag(name: str, value: object) -> None:
    """ValueError unless `value` is True or False: a string such as "no" would count as true."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False (got {shown(value)})")


def _template_vars(value: object) -> dict[str, Any]:
    """`chat_template_kwargs` as the template takes them: a mapping of variable names to JSON values
    (`enable_thinking` True or False), or None for none (decoding/template_vars.py)."""
    from .decoding.template_vars import check_template_vars

    return check_template_vars(value, "chat_template_kwargs")  # a ValueError naming the keyword


def _model_ref(name: str, value: object) -> str:
    """A model reference as the loader takes it: a string (or a path object, as its string)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and value:
        return value
    raise ValueError(
        f"{name} must be a model: an alias, a .gguf path, hf:ORG/REPO/FILE.gguf or ORG/REPO:QUANT "
        f"(got {shown(value)})"
    )


def _endpoints(rpc: object) -> tuple[str, ...]:
    """`load`'s `rpc` as the loader's tuple of `HOST:PORT` workers: None, one comma-separated string or
    a sequence of them; a bad one is a ValueError naming it (llama.cpp would abort on it)."""
    from .errors import BadInput
    from .llama.rpc_wire import parse_endpoints  # standard library only

    if rpc is None:
        return ()
    items = [rpc] if isinstance(rpc, str) else rpc
    if not isinstance(items, Sequence) or not items or not all(isinstance(i, str) for i in items):
        raise ValueError(
            f"rpc must be 'HOST:PORT', several of them (a list or comma-separated) or None (got {shown(rpc)})"
        )
    try:
        return tuple(str(e) for e in parse_endpoints(",".join(items)))
    except BadInput as exc:
        raise ValueError(f"rpc: {exc.message}") from None


def _specs(draft: object) -> tuple[str, ...]:
    """`load`'s `draft` as the loader's tuple of specs, each once: one spec, or a sequence of them."""
    if isinstance(draft, str | os.PathLike):
        return (_model_ref("draft", draft),)
    if not isinstance(draft, Sequence) or isinstance(draft, bytes):
        raise ValueError(
            f"draft must be a drafter (a model, or a spec such as 'ngram'), a sequence of them, or None "
            f"(got {shown(draft)})"
        )
    return tuple(dict.fromkeys(_model_ref("draft", d) for d in draft))


def _messages(prompt: object, system: object) -> list[dict[str, Any]]:
    """The conversation `stream` answers: the user's message after `system`, or the messages given
    (each a mapping with a string `role` and a string or None `content`), copied."""
    if system is not None and not isinstance(system, str):
        raise ValueError(f"system must be a string or None (got {shown(system)})")
    if isinstance(prompt, str):
        return [
            *([{"role": "system", "content": system}] if system else []),
            {"role": "user", "content": prompt},
        ]
    takes = 'prompt must be a string or a non-empty sequence of {"role": ..., "content": ...} messages'
    if not isinstance(prompt, Sequence) or isinstance(prompt, bytes) or not prompt:
        raise ValueError(f"{takes} (got {shown(prompt)})")
    for m in prompt:
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str | None)
        ):
            raise ValueError(f"{takes} (got the message {shown(m)})")
    return [dict(m) for m in prompt]


def _processors(given: object) -> tuple[LogitsProcessor, ...]:
    """`logits_processors` as the loop takes them: a sequence of callables."""
    if isinstance(given, Sequence) and not isinstance(given, str | bytes) and all(callable(p) for p in given):
        return tuple(given)
    raise ValueError(
        "logits_processors must be a sequence of functions (tokens so far, logits row) -> row "
        f"(got {shown(given)})"
    )
