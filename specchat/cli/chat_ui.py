"""The interactive terminal chat: read lines, answer with the coloured stream, run `/`-commands.

The session logic (history, commands, trimming, transcripts) is `decoding.session.ChatSession`; this
module only reads lines and shows things with Rich. Reading input goes through an injectable function
(`input` with stdlib `readline` on a terminal), so the CLI runner can script whole chats. Started by
`chat`, and by `run` when no prompt is given on a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..decoding.events import sources_for
from ..decoding.session import (
    COMMANDS,
    INPUT_HELP,
    STATS_HEADER,
    Action,
    ChatSession,
    InputAssembler,
    stats_rows,
    totals_row,
)
from ..errors import SpecchatError
from . import render
from .common import check_vocab, err_console, fail_line, load_models, out_console

if TYPE_CHECKING:
    from .options import Options

LineReader = Callable[[str], str]

HISTORY_LINES = 1000


def start_chat(opts: Options, *, no_color: bool = False) -> None:
    """Load the models for `opts` and chat on stdin/stdout until Ctrl-D or /exit."""
    from ..models.loader import LoadedEngine

    err = err_console()
    drafts = opts.drafts_to_load(announce=lambda line: err.print(f"[dim]{escape(line)}[/]", soft_wrap=True))
    loaded = load_models(opts.load_config(drafts), err)
    try:
        check_vocab(opts.params, loaded.target.n_vocab)  # a --logit-bias id: now, not at every message
        for w in loaded.warnings:
            err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
        session = ChatSession(
            LoadedEngine(loaded, seed=opts.seed),
            system=opts.system,
            k=opts.k,
            params=opts.params,
            p_min=opts.p_min,
            max_tokens=opts.max_tokens,
            seed=opts.seed,
            names={"target": opts.target, "drafts": ", ".join(d.name for d in loaded.drafters) or "none"},
            template_kwargs=opts.template_kwargs,
        )
        console = out_console(no_color)
        with line_reader(sys.stdin) as read_line:
            ChatUI(session, console, read_line=read_line).run()
    finally:
        loaded.close()


@contextmanager
def line_reader(stdin: object) -> Iterator[LineReader]:
    """`input`, with stdlib readline's line editing and a persistent history on a terminal.

    The history file lives in specchat's cache dir, so arrow-up works across sessions. Elsewhere
    (pipes, the test runner) it is plain `input`, which reads scripted lines just as well.
    """
    history: Path | None = None
    readline = None
    if stdin is not None and getattr(stdin, "isatty", lambda: False)():
        try:
            import readline
        except ImportError:  # Windows without pyreadline: input() still works, just plainer
            readline = None
    if readline is not None:
        from ..models.cache import cache_dirs

        history = cache_dirs()["specchat_home"] / "chat_history"
        with suppress(OSError):  # first run, or an unreadable file: start with an empty history
            readline.read_history_file(history)
        readline.set_history_length(HISTORY_LINES)
    try:
        yield input
    finally:
        if readline is not None and history is not None:
            with suppress(OSError):  # a read-only cache dir only loses the history
                history.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(history)


class ChatUI:
    """The read–answer loop: Rich output, slash commands, Ctrl-C stops an answer, Ctrl-D quits."""

    def __init__(
        self,
        session: ChatSession,
        console: Console,
        *,
        read_line: LineReader = input,
    ) -> None:
        self.session = session
        self.console = console
        self.read_line = read_line
        # \001..\002 tell readline the escape codes take no room, so line editing stays aligned
        fancy = console.is_terminal and console.color_system is not None and not console.no_color
        self.prompt = "\001\x1b[1;36m\002you›\001\x1b[0m\002 " if fancy else "you> "
        self.more = "\001\x1b[2m\002...\001\x1b[0m\002 " if fancy else "... "
        self.sources = sources_for([d.source for d in session.engine.drafters])
        self._advised = False  # the low-acceptance advice is given once per chat

    def run(self) -> None:
        self._banner()
        asm = InputAssembler()
        while True:
            try:
                line = self.read_line(self.more if asm.pending else self.prompt)
            except EOFError:
                self.console.print()
                return
            except KeyboardInterrupt:
                asm.reset()
                self.console.print("\n[dim](input cleared; Ctrl-D or /exit quits)[/]")
                continue
            text = asm.feed(line)
            if text is None or not text.strip():
                continue
            if text.startswith("/") and not text.startswith("//"):
                if not self.command(text):
                    return
                continue
            self.answer(text[1:] if text.startswith("//") else text)

    def _banner(self) -> None:
        s = self.session
        drafts = str(s.names.get("drafts", "none"))
        k = "auto" if s.k is None else str(s.k)
        self.console.print(
            f"[bold]specchat chat[/] · {escape(str(s.names.get('target', '')))}"
            + (f" · draft {escape(drafts)} (k {k})" if s.engine.drafters else " · no draft")
            + " · [dim]/help for commands, Ctrl-D to quit[/]",
            highlight=False,
        )
        if s.engine.drafters:
            self.console.print(render.legend(self.sources))

    def answer(self, text: str) -> None:
        """Generate and show one answer. Ctrl-C stops it; what was shown stays in the history."""
        try:
            ans = self.session.ask(text)
            for note in ans.notices:
                self.console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
            stream = render.TokenStream(self.console)
            shown = render.consume(ans.events, stream, ans.tally)
        except SpecchatError as exc:
            self.console.print(fail_line(exc), soft_wrap=True)
            return
        except KeyboardInterrupt:  # while preparing the prompt, before any output
            self.console.print("[yellow]stopped[/]")
            return
        for note in shown.notices:
            self.console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
        if shown.interrupted:
            self.console.print("[yellow]stopped[/] [dim](what was shown stays in the conversation)[/]")
        if shown.stats is not None:
            self.console.print(render.stats_line(shown.stats), soft_wrap=True)
        self._advise()

    def _advise(self) -> None:
        """Once per chat: say so when the draft model's acceptance over the conversation stays low."""
        from ..decoding.advice import acceptance_advice
        from ..decoding.events import Source

        total = self.session.totals()
        if self._advised or total is None:
            return
        engine = self.session.engine
        models = [d.name for d in engine.drafters if d.source is Source.DRAFT]
        line = acceptance_advice(total, models, engine.target.name)
        if line:
            self._advised = True
            self.console.print(f"[yellow]note:[/] {escape(line)}", highlight=False, soft_wrap=True)

    def command(self, text: str) -> bool:
        """Run a slash command; False means quit."""
        try:
            reply = self.session.handle(text)
            if reply.message:
                self.console.print(f"[dim]{escape(reply.message)}[/]", highlight=False)
            if reply.action is Action.EXIT:
                return False
            if reply.action is Action.HELP:
                self.show_help()
            elif reply.action is Action.STATS:
                self.show_stats()
            elif reply.action is Action.SAVE_SVG and reply.path is not None:
                render.export_svg(
                    reply.path, self.session.turns, sources=self.sources, system=self.session.system
                )
                self.console.print(f"[dim]saved {escape(str(reply.path))}[/]", highlight=False)
        except SpecchatError as exc:
            self.console.print(fail_line(exc), soft_wrap=True)
        return True

    def show_help(self) -> None:
        table = Table.grid(padding=(0, 2))
        for cmd, what in COMMANDS:
            table.add_row(Text(cmd, style="bold"), what)
        self.console.print(table, soft_wrap=False)
        self.console.print(Text(INPUT_HELP, style="dim"))
        if self.session.engine.drafters:
            self.console.print(render.legend(self.sources))

    def show_stats(self) -> None:
        if not self.session.records:
            self.console.print("[dim]no answers yet[/]")
            return
        table = Table(*STATS_HEADER, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
        for row in stats_rows(self.session.records):
            table.add_row(*row)
        total = self.session.totals()
        if total is not None and len(self.session.records) > 1:
            table.add_section()
            table.add_row(*totals_row(total), style="bold")
        self.console.print(table, soft_wrap=False)
        self.console.print(
            "[dim]prefill, time = prompt tokens processed this turn and seconds taken (the rest of the "
            "prompt came from the KV cache) · "
            "accept = drafted tokens the target kept · acc/pass = accepted drafts per target pass · "
            "* = stopped with Ctrl-C[/]"
        )
