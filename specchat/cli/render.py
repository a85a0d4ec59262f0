"""Everything Rich: the coloured token stream, the legend, the stats line, the SVG export. Takes a
Console, so tests render into a recording console and the CLI/chat choose stdout, stderr or a file."""

from __future__ import annotations

import io
import os
import signal
import threading
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..decoding.events import LABELS, STYLES, Done, Event, Notice, Round, Source, Stats, Token
from ..errors import BadInput
from ..terminal import terminal_safe

if TYPE_CHECKING:
    from ..decoding.session import Turn


def legend(sources: tuple[Source, ...] = (Source.DRAFT, Source.CORRECTION, Source.BONUS)) -> Text:
    """One line naming each colour, printed once before the stream."""
    text = Text("legend: ", style="dim")
    for i, src in enumerate(sources):
        if i:
            text.append("  ")
        text.append(f"■ {LABELS[src]}", style=STYLES[src] or "default")
    return text


class TokenStream:
    """Shows token pieces as they arrive, each in its source's colour.

    On a terminal it is a Rich Live view: the coloured text plus a status line under it (tok/s,
    acceptance, current k, tokens per target pass) that refreshes while generating and disappears at
    the end. Elsewhere (pipes, files) it just writes the text as it comes, with no status.
    """

    def __init__(self, console: Console, *, live: bool | None = None) -> None:
        self.console = console
        self.text = Text()
        self._status = Text("", style="dim")
        self._live: Live | None = None
        if live if live is not None else console.is_terminal:
            self._live = Live(
                Group(self.text, self._status),
                console=console,
                refresh_per_second=8,
                vertical_overflow="visible",
                transient=False,
            )
            self._live.start()

    def write(self, tok: Token) -> None:
        if not tok.text:
            return
        style = STYLES[tok.source]
        piece = terminal_safe(tok.text)
        self.text.append(piece, style=style)
        if self._live is None:
            self.console.print(Text(piece, style=style), end="", soft_wrap=True, highlight=False)
            self.console.file.flush()

    def status(self, line: str) -> None:
        self._status.plain = line

    def end(self) -> None:
        """Finish the view: the final text stays, the status line goes."""
        if self._live is not None:
            self._status.plain = ""
            self._live.update(self.text, refresh=True)
            self._live.stop()
            self._live = None
        else:
            self.console.print()


def stats_line(stats: Stats) -> Text:
    """The one-line summary after a run: the numbers users compare between settings."""
    parts = [
        f"{stats.generated_tokens} tokens",
        f"{stats.tokens_per_second:.1f} tok/s",
    ]
    if stats.drafted:
        # by drafter, so a user sees which one did the work (the MTP head, a draft model, n-gram lookup)
        by = ", ".join(f"{d.name} {d.accepted}/{d.drafted}" for d in stats.drafters if d.drafted)
        parts.append(f"acceptance {stats.acceptance_rate:.0%} ({by or f'{stats.accepted}/{stats.drafted}'})")
    parts.append(f"{stats.tokens_per_pass:.2f} tokens/target pass")
    parts.append(f"prefill {stats.prefill_tokens} tok in {stats.prefill_seconds:.2f}s")
    if stats.stop_reason != "eog":
        parts.append(f"stopped: {stats.stop_reason.replace('_', ' ')}")
    return Text(" · ".join(parts), style="dim")


def status_text(tally: object, rnd: object) -> str:
    """Plain-text status: what the auto-tuner is doing right now and how well it is going."""
    gen = getattr(tally, "generated", 0)
    secs = getattr(tally, "decode_seconds", 0.0) or 1e-9
    drafted = getattr(tally, "drafted", 0)
    acc = getattr(tally, "accepted", 0)
    passes = getattr(tally, "passes", 0) or 1
    rate = f"{acc / drafted:.0%}" if drafted else "–"
    return (
        f"{gen / secs:5.1f} tok/s · acceptance {rate} · k={getattr(rnd, 'k', 0)} · "
        f"{gen / passes:.2f} tok/pass"
    )


@dataclass(slots=True)
class Shown:
    """What a consumed generation produced, for --json, transcripts and the stats line."""

    ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    stats: Stats | None = None
    interrupted: bool = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def consume(events: Generator[Event, None, None], stream: TokenStream | None, tally: object) -> Shown:
    """Drive a generation to its end, showing tokens as they come.

    Ctrl-C stops it: the generator is closed (which leaves the caches consistent), what was shown is
    kept, and the stats so far come from the caller's tally.

    The generator is closed on every way out (a closed pipe, an engine error), not only Ctrl-C: its
    cleanup trims the models' caches, so it must run now, while the models are open. Left to the
    garbage collector it ran after the caller had freed the models: a use-after-free segfault
    (`specchat run ... | head -c 20` died with SIGSEGV now and then).
    """
    shown = Shown()
    try:
        with _ctrl_c_noted() as pressed:
            for ev in events:
                if pressed.is_set():  # Ctrl-C came, but its KeyboardInterrupt was swallowed
                    raise KeyboardInterrupt
                _show(ev, shown, stream, tally)
    except KeyboardInterrupt:
        shown.interrupted = True
        events.close()
        shown.stats = tally.snapshot("interrupted")  # type: ignore[attr-defined]
    finally:
        events.close()  # no-op when it finished or was closed above
        if stream is not None:
            stream.end()
    return shown


@contextmanager
def _ctrl_c_noted() -> Iterator[threading.Event]:
    """SIGINT raises KeyboardInterrupt as usual, and is also noted in an Event that consume checks
    between events. Why: Python raises KeyboardInterrupt wherever the main thread is when the signal
    is handled, and there it can be lost -- inside a finalizer or a C callback Python only prints
    "Exception ignored" and goes on (`specchat run` then wrote all its tokens and exited 0 now and
    then, under load). The handler is also installed over an inherited SIG_IGN, and SIGINT unblocked,
    so a parent that ignored or blocked it cannot make the command deaf to Ctrl-C."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def on_sigint(signum: int, frame: object) -> None:
        pressed.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def _show(ev: Event, shown: Shown, stream: TokenStream | None, tally: object) -> None:
    """One event of a generation: a token is kept and shown, a round updates the status line."""
    if isinstance(ev, Token):
        shown.ids.append(ev.id)
        shown.sources.append(ev.source.value)
        shown.pieces.append(ev.text)
        if stream is not None:
            stream.write(ev)
    elif isinstance(ev, Round):
        if stream is not None:
            stream.status(status_text(tally, ev))
    elif isinstance(ev, Notice):
        shown.notices.append(ev.message)
    elif isinstance(ev, Done):
        shown.stats = ev.stats


def export_svg(
    path: str | os.PathLike[str],
    turns: Sequence[Turn],
    *,
    sources: tuple[Source, ...] = (Source.DRAFT, Source.CORRECTION, Source.BONUS),
    system: str | None = None,
    title: str = "specchat",
    width: int = 100,
) -> None:
    """Write the turns, coloured by token source, as an SVG picture (Rich's export_svg).

    Rendered afresh from the recorded tokens rather than captured from the live screen, whose
    refreshes would repeat lines. For `specchat run`: `export_svg(FILE, [Turn.from_shown(prompt,
    shown)], sources=sources)`.
    """
    console = Console(
        record=True, file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor"
    )
    console.print(legend(sources))
    if system:
        console.print(Text(f"system: {terminal_safe(system)}", style="dim"))
    for t in turns:
        console.print(Text.assemble(("you› ", "bold cyan"), terminal_safe(t.user)))
        answer = Text()
        for piece, src in zip(t.pieces, t.sources, strict=True):
            answer.append(terminal_safe(piece), style=STYLES[Source(src)])
        console.print(answer)
        if t.stats is not None:
            console.print(stats_line(t.stats))
    try:
        console.save_svg(os.fspath(path), title=title)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
