"""The chat session: history, per-turn settings, `/`-commands, context trimming and transcripts.

No Rich and no llama_cpp here: the session talks to its models through the small `Engine` protocol
(a target, its drafters, a template function, a planner factory), so tests drive whole conversations
with numpy fakes. The terminal UI lives in `chat_ui.py`.

Why KV reuse needs nothing special: each turn the whole conversation is rendered with the target's
chat template and handed to `loop.generate`, which (like each drafter) decodes only what
differs from what its cache already holds. Because earlier turns render to the same tokens every
time, turn N+1 costs only its new tokens. Two things would break that prefix and are done sparingly:
changing the system prompt, and trimming old turns when the context fills up (so trimming frees a
margin at once instead of one turn per answer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import BadInput, ContextFull
from .calibration import trees_exact
from .constraint import Constraint
from .drafters import Drafter, default_p_min
from .events import Done, Event, Stats, Token, total
from .loop import Planner, Settings, Tally, generate
from .model import Model
from .processors import LogitsProcessor
from .sampling import SamplingParams
from .settings import MAX_TOKENS, SettingError

Message = dict[str, str]

#: Trimming drops turns until the prompt takes at most this share of the space left for it, so the
#: next few turns fit without trimming (each trim changes the prefix and costs a full re-prefill).
TRIM_TO = 0.75


class Engine(Protocol):
    """What a chat needs from the loaded models. `loader.LoadedEngine` wraps llama.cpp models;
    tests pass fakes."""

    @property
    def target(self) -> Model: ...

    @property
    def drafters(self) -> Sequence[Drafter]: ...

    @property
    def tie_margin(self) -> float:
        """Greedy verification margin (loop.Settings.tie_margin; 0 where rounding is exact)."""
        ...

    @property
    def exact_rows(self) -> int:
        """Verify batches this many rows or fewer need no margin (loop.Settings.exact_rows)."""
        ...

    @property
    def strict(self) -> bool:
        """--strict: greedy output equal to one-token decoding (loop.Settings.strict)."""
        ...

    def render(
        self, messages: Sequence[Message], *, template_kwargs: Mapping[str, Any] | None = None
    ) -> tuple[list[int], str | None]:
        """Token ids of the conversation in the chat template, `template_kwargs` its extra variables
        (+ a warning); ContextFull if too long."""
        ...

    def planner(self, k: int | None) -> Planner:
        """A planner for a fixed k, or the auto-tuner for None."""
        ...


def answer_events(
    engine: Engine,
    prompt: Sequence[int],
    *,
    drafters: Sequence[Drafter],
    planner: Planner | None,
    params: SamplingParams,
    max_tokens: int,
    rng: np.random.Generator,
    tally: Tally,
    logprobs: int | None = None,
    constraint: Constraint | None = None,
    processors: tuple[LogitsProcessor, ...] = (),
) -> Generator[Event, None, None]:
    """The speculative loop over an engine's models, with the verification settings loading measured.

    Whatever the engine's caches hold from the last answer is reused by common prefix (see the module
    docstring); the chat session, the HTTP server and `specchat run` all generate through here.
    `logprobs`: give each Token the target's log-probabilities with this many alternatives
    (loop.Settings.logprobs; None computes nothing). `constraint`: output the constrained target's
    (a grammar compiled for this answer: decoding/constraint.py). `processors`: logits processors of
    the caller's own (loop.Settings.processors; the Python API's). A `logit_bias` naming a token the
    target's vocabulary lacks is BadInput, before anything is decoded (the server checks it first,
    to answer a 400).
    """
    try:
        params.check_vocab(engine.target.n_vocab)
    except SettingError as exc:
        raise BadInput(str(exc)) from None
    return generate(
        engine.target,
        prompt,
        drafters=drafters,
        planner=planner,
        settings=Settings(
            max_tokens=max_tokens,
            params=params,
            tie_margin=engine.tie_margin,
            exact_rows=engine.exact_rows,
            exact_trees=trees_exact(engine.exact_rows),
            strict=engine.strict,
            logprobs=logprobs,
            processors=processors,
        ),
        rng=rng,
        tally=tally,
        constraint=constraint,
    )


def follow_temperature(
    drafters: Sequence[Drafter], p_min: float | None, params: SamplingParams, *, auto: bool = False
) -> None:
    """Drafters' confidence cut-off follows the temperature (and, under `-k auto`, is left to the
    planner) unless the user fixed it (`p_min`)."""
    value = p_min if p_min is not None else default_p_min(params, auto=auto)
    for d in drafters:
        if d.p_min is not None:  # None: a drafter without a confidence cut-off
            d.p_min = value


@dataclass(slots=True)
class Turn:
    """One exchange: the user's message and the answer as shown, token by token with its source."""

    user: str
    ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    stats: Stats | None = None
    interrupted: bool = False

    @property
    def answer(self) -> str:
        return "".join(self.pieces)

    @classmethod
    def from_shown(cls, user: str, shown: object) -> Turn:
        """From a `render.Shown` (what `specchat run` printed), e.g. to export it as SVG."""
        return cls(
            user=user,
            ids=list(getattr(shown, "ids", [])),
            pieces=list(getattr(shown, "pieces", [])),
            sources=list(getattr(shown, "sources", [])),
            stats=getattr(shown, "stats", None),
            interrupted=bool(getattr(shown, "interrupted", False)),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "user": self.user,
            "answer": self.answer,
            "interrupted": self.interrupted,
            "tokens": [
                {"id": i, "text": t, "source": s}
                for i, t, s in zip(self.ids, self.pieces, self.sources, strict=True)
            ],
            "stats": self.stats.to_dict() if self.stats is not None else None,
        }


@dataclass(frozen=True, slots=True)
class TurnStats:
    """One row of `/stats`. Kept across `/reset`: the table is about the session, not the topic."""

    number: int
    stats: Stats
    k: str  # the setting at the time: "auto", a number, or "off"


@dataclass(slots=True)
class Answer:
    """A prepared turn: the prompt it will run on, notices to show first, and the events to consume.

    The session records the turn when `events` finishes, however it finishes (end, close, Ctrl-C).
    """

    prompt: list[int]
    notices: list[str]
    events: Generator[Event, None, None]
    tally: Tally


class Action(str, Enum):
    """What the UI must do after a command the session cannot complete on its own."""

    NONE = "none"
    HELP = "help"
    STATS = "stats"
    SAVE_SVG = "save_svg"
    EXIT = "exit"


@dataclass(frozen=True, slots=True)
class Reply:
    message: str = ""
    action: Action = Action.NONE
    path: Path | None = None


COMMANDS: tuple[tuple[str, str], ...] = (
    ("/help", "this help and the colour legend"),
    ("/stats", "per-turn table: tokens, tok/s, acceptance, mean accepted per pass, prefill; totals"),
    ("/k N|auto", "draft N tokens per round (0 = none), or let the cost model choose"),
    ("/draft on|off", "use the draft model(s), or decode with the target alone"),
    ("/temp X", "sampling temperature (0 = greedy)"),
    ("/system TEXT", "set the system prompt (`/system` shows it, `/system -` clears it)"),
    ("/reset", "forget the conversation (the system prompt and settings stay)"),
    ("/save FILE", "save the transcript: .md, .json (per-token sources) or .svg (coloured picture)"),
    ("/exit", "quit (Ctrl-D too)"),
)

INPUT_HELP = (
    "End a line with \\ to continue on the next one; or paste between two lines of three quotes "
    '("""). Start a message with // to send text that begins with /. Ctrl-C stops an answer.'
)


class InputAssembler:
    """Joins input lines into one message: a trailing backslash continues the line, and a line of
    three double quotes opens or closes a block taken verbatim (for pasting code)."""

    FENCE = '"""'

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._in_block = False

    @property
    def pending(self) -> bool:
        """True while a message is incomplete (the UI shows a continuation prompt)."""
        return self._in_block or bool(self._lines)

    def reset(self) -> None:
        self._lines = []
        self._in_block = False

    def feed(self, line: str) -> str | None:
        """Add one line; returns the whole message once it is complete, else None."""
        if self._in_block:
            if line.strip() == self.FENCE:
                return self._finish()
            self._lines.append(line)
            return None
        if line.strip() == self.FENCE and not self._lines:
            self._in_block = True
            return None
        if line.endswith("\\") and not line.endswith("\\\\"):
            self._lines.append(line[:-1])
            return None
        self._lines.append(line)
        return self._finish()

    def _finish(self) -> str:
        text = "\n".join(self._lines)
        self.reset()
        return text


class ChatSession:
    """A conversation with one loaded target (and drafters) and the settings `/`-commands change."""

    def __init__(
        self,
        engine: Engine,
        *,
        system: str | None = None,
        k: int | None = None,
        draft: bool = True,
        params: SamplingParams | None = None,
        p_min: float | None = None,
        max_tokens: int = MAX_TOKENS,
        seed: int | None = None,
        names: dict[str, object] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.system = system or None
        #: the chat template's extra variables (`enable_thinking`, ...): checked by the front end
        self.template_kwargs = dict(template_kwargs or {})
        self.k = k
        self.draft = draft and bool(engine.drafters)
        self.params = params if params is not None else SamplingParams()
        self.p_min = p_min  # None: follow the temperature (default_p_min)
        self.max_tokens = max_tokens
        self.names = dict(names or {})
        self.turns: list[Turn] = []  # the conversation since the last /reset (transcripts show all)
        self.first = 0  # turns[first:] are still in the context window; older ones were trimmed
        self.records: list[TurnStats] = []
        self.rng = np.random.default_rng(seed)
        self._planner: Planner | None = None
        self._warned: set[str] = set()  # template warnings repeat every turn: show each once
        self._apply_p_min()

    # --- conversation -----------------------------------------------------------------------------
    def messages(self, user: str | None = None) -> list[Message]:
        """The messages the model sees: system prompt, turns still in the window, then `user`."""
        out: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        for t in self.turns[self.first :]:
            out.append({"role": "user", "content": t.user})
            out.append({"role": "assistant", "content": t.answer})
        if user is not None:
            out.append({"role": "user", "content": user})
        return out

    def ask(self, user: str) -> Answer:
        """Prepare the answer to `user`: render (trimming old turns if needed), then return the
        events. Raises ContextFull only when the message does not fit even on its own."""
        prompt, notices = self._fit(user)
        tally = Tally()
        drafters = list(self.engine.drafters) if self.draft else []
        if drafters and self._planner is None:
            self._planner = self.engine.planner(self.k)
        gen = answer_events(
            self.engine,
            prompt,
            drafters=drafters,
            planner=self._planner,
            params=self.params,
            max_tokens=self.max_tokens,
            rng=self.rng,
            tally=tally,
        )
        return Answer(prompt, notices, self._recorded(user, gen, tally), tally)

    def _fit(self, user: str) -> tuple[list[int], list[str]]:
        n_ctx = self.engine.target.n_ctx
        reserve = min(self.max_tokens, n_ctx // 2)  # room kept for the answer
        limit = max(1, n_ctx - reserve)
        notices: list[str] = []
        tokens, warning = self._render(user)
        if tokens is None or len(tokens) > limit:
            goal = int(limit * TRIM_TO)
            dropped = 0
            while self.first < len(self.turns) and (tokens is None or len(tokens) > goal):
                self.first += 1
                dropped += 1
                tokens, warning = self._render(user)
            if tokens is None:
                raise ContextFull(
                    f"this message does not fit in the context window of {n_ctx} tokens "
                    f"(with {reserve} kept for the answer)",
                    "shorten it, /system - to drop the system prompt, or restart with a larger --ctx-size",
                )
            if dropped:
                kept = " (the system prompt is kept)" if self.system else ""
                notices.append(
                    f"context window nearly full: dropped the {dropped} oldest turn"
                    f"{'s' if dropped > 1 else ''} from what the model sees{kept}"
                )
        if warning and warning not in self._warned:
            self._warned.add(warning)
            notices.append(warning)
        return tokens, notices

    def _render(self, user: str) -> tuple[list[int] | None, str | None]:
        try:
            return self.engine.render(self.messages(user), template_kwargs=self.template_kwargs)
        except ContextFull:
            return None, None

    def _recorded(
        self, user: str, gen: Generator[Event, None, None], tally: Tally
    ) -> Generator[Event, None, None]:
        """Pass events through, and record the turn however the stream ends (Ctrl-C included)."""
        turn = Turn(user)
        try:
            for ev in gen:
                if isinstance(ev, Token):
                    turn.ids.append(ev.id)
                    turn.pieces.append(ev.text)
                    turn.sources.append(ev.source.value)
                elif isinstance(ev, Done):
                    turn.stats = ev.stats
                yield ev
        finally:
            gen.close()  # leaves the caches consistent (see loop.generate)
            if turn.stats is None:
                turn.interrupted = True
                turn.stats = tally.snapshot("interrupted")
            self._record(turn)

    def _record(self, turn: Turn) -> None:
        k = "off" if not self.draft else ("auto" if self.k is None else str(self.k))
        assert turn.stats is not None
        self.records.append(TurnStats(len(self.records) + 1, turn.stats, k))
        if turn.interrupted and not turn.ids:
            return  # stopped before any output: keep no empty answer for the model to imitate
        self.turns.append(turn)

    # --- commands ---------------------------------------------------------------------------------
    def handle(self, line: str) -> Reply:
        """Run one `/`-command. Bad arguments and unknown commands raise BadInput (one line)."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        name = name.lower()
        if name in ("/exit", "/quit"):
            return Reply(action=Action.EXIT)
        if name in ("/help", "/?"):
            return Reply(action=Action.HELP)
        if name == "/stats":
            return Reply(action=Action.STATS)
        if name == "/k":
            return self._set_k(arg)
        if name == "/draft":
            return self._set_draft(arg)
        if name == "/temp":
            return self._set_temp(arg)
        if name == "/system":
            return self._set_system(arg)
        if name == "/reset":
            self.turns.clear()
            self.first = 0
            return Reply("conversation cleared" + (" (system prompt kept)" if self.system else ""))
        if name == "/save":
            return self._save(arg)
        raise BadInput(f"unknown command {name}", "type /help for the list of commands")

    def _set_k(self, arg: str) -> Reply:
        if arg == "auto":
            k: int | None = None
        else:
            try:
                k = int(arg)
            except ValueError:
                raise BadInput(f"/k needs a number or `auto` (got {arg!r})") from None
            if not 0 <= k <= 64:
                raise BadInput(f"/k must be between 0 and 64 (got {k})")
        self.k = k
        self._planner = None  # the next turn builds one for the new setting
        self._apply_p_min()  # -k auto leaves the cut-off to the planner, a fixed k has one
        note = "" if self.draft else " (drafting is off: /draft on to use it)"
        return Reply(f"draft tokens per round: {'auto (cost model)' if k is None else k}{note}")

    def _set_draft(self, arg: str) -> Reply:
        if arg not in ("on", "off"):
            raise BadInput(f"/draft takes on or off (got {arg!r})")
        if arg == "on" and not self.engine.drafters:
            raise BadInput("no draft model is loaded", "restart with --draft MODEL (or --draft ngram)")
        self.draft = arg == "on"
        return Reply("drafting on" if self.draft else "drafting off: the target decodes alone")

    def _set_temp(self, arg: str) -> Reply:
        try:
            temp = float(arg)
        except ValueError:
            raise BadInput(f"/temp needs a number >= 0 (got {arg!r})") from None
        try:
            self.params = replace(self.params, temperature=temp)  # checked by the settings' table
        except SettingError as exc:
            raise BadInput(exc.line("/temp")) from None
        self._apply_p_min()
        return Reply(f"temperature {temp:g}" + (" (greedy)" if self.params.greedy else ""))

    def _set_system(self, arg: str) -> Reply:
        if not arg:
            return Reply(f"system prompt: {self.system}" if self.system else "no system prompt")
        self.system = None if arg == "-" else arg
        return Reply("system prompt cleared" if self.system is None else "system prompt set")

    def _save(self, arg: str) -> Reply:
        if not arg:
            raise BadInput("/save needs a file name", "e.g. /save chat.md, chat.json or chat.svg")
        path = Path(arg).expanduser()
        suffix = path.suffix.lower()
        if suffix == ".svg":
            return Reply(action=Action.SAVE_SVG, path=path)
        text = self.to_json() if suffix == ".json" else self.to_markdown()
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
        return Reply(f"saved {len(self.turns)} turn{'s' if len(self.turns) != 1 else ''} to {path}")

    def _apply_p_min(self) -> None:
        follow_temperature(self.engine.drafters, self.p_min, self.params, auto=self.k is None)

    # --- reports ----------------------------------------------------------------------------------
    def totals(self) -> Stats | None:
        """All turns of the session added up (rates recomputed from the sums)."""
        if not self.records:
            return None
        return total([r.stats for r in self.records], one_prompt=False)

    def to_markdown(self) -> str:
        lines = ["# specchat chat", ""]
        lines += [f"- {key}: {value}" for key, value in self.names.items()]
        lines.append(f"- saved: {time.strftime('%Y-%m-%d %H:%M:%S')}")
        if self.system:
            lines += ["", "## System", "", self.system]
        for t in self.turns:
            lines += ["", "## User", "", t.user, "", "## Assistant", "", t.answer]
            if t.interrupted:
                lines += ["", "*(stopped)*"]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        doc = {
            **{str(k): v for k, v in self.names.items()},
            "system": self.system,
            "turns": [t.to_json() for t in self.turns],
        }
        return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def stats_rows(records: Sequence[TurnStats]) -> list[tuple[str, ...]]:
    """The /stats table as strings (the UI only lays them out): one row per turn."""
    return [(str(r.number), r.k, *_figures(r.stats)) for r in records]


STATS_HEADER: tuple[str, ...] = (
    "#",
    "k",
    "prompt",
    "prefill",
    "time",
    "tokens",
    "tok/s",
    "accept",
    "acc/pass",
    "tok/pass",
)


def _figures(s: Stats) -> tuple[str, ...]:
    return (
        str(s.prompt_tokens),
        str(s.prefill_tokens),
        f"{s.prefill_seconds:.2f}",
        str(s.generated_tokens) + ("*" if s.stop_reason == "interrupted" else ""),
        f"{s.tokens_per_second:.1f}",
        f"{s.acceptance_rate:.0%}" if s.drafted else "–",
        f"{s.mean_accepted_per_pass:.2f}",
        f"{s.tokens_per_pass:.2f}",
    )


def totals_row(total: Stats) -> tuple[str, ...]:
    return ("all", "", *_figures(total))
