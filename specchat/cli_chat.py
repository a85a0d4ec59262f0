"""`specchat chat`: the interactive terminal chat, and the SVG export shared with `run`.

The session logic (history, commands, trimming, transcripts) is `chat.ChatSession`; this module only
loads the models, reads lines, and shows things with Rich. Reading input goes through an injectable
function (`input` with stdlib `readline` on a terminal), so the CLI runner can script whole chats.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import render
from .chat import (
    COMMANDS,
    INPUT_HELP,
    STATS_HEADER,
    Action,
    ChatSession,
    InputAssembler,
    Turn,
    stats_rows,
    totals_row,
)
from .cli_common import err_console, fail_line, guarded, out_console
from .drafters import default_p_min
from .errors import BadInput, SpecchatError
from .events import Source
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .drafters import Drafter
    from .loader import Loaded
    from .model import Model
    from .speculative import Planner

LineReader = Callable[[str], str]

HISTORY_LINES = 1000


def register(app: typer.Typer) -> None:
    """Add `chat` to the app (called by cli._register_more)."""
    app.command("chat")(chat)


@dataclass(slots=True)
class LoadedEngine:
    """`chat.Engine` over models from `loader.load`: the GGUF chat template and the real planner."""

    loaded: Loaded
    seed: int | None = None

    @property
    def target(self) -> Model:
        return self.loaded.target

    @property
    def drafters(self) -> Sequence[Drafter]:
        return self.loaded.drafters

    @property
    def tie_margin(self) -> float:
        return self.loaded.tie_margin

    @property
    def exact_rows(self) -> int:
        return self.loaded.exact_rows

    def render(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], str | None]:
        from . import loader

        return loader.chat_prompt(self.loaded.target, messages)

    def planner(self, k: int | None) -> Planner:
        from .tuning import make_planner

        return make_planner(self.loaded, k, seed=self.seed)


@guarded
def chat(
    target: TargetArg,
    draft: DraftOpt = None,
    no_draft: NoDraftOpt = False,
    k: KOpt = "auto",
    p_min: PMinOpt = None,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    seed: SeedOpt = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Stop each answer after this many tokens.")
    ] = 512,
    ctx_size: CtxOpt = 4096,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    threads: ThreadsOpt = None,
    system: SystemOpt = None,
    no_color: Annotated[
        bool, typer.Option("--no-color", help="No colours (also when NO_COLOR is set).")
    ] = False,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Chat with a local model in the terminal; tokens are coloured by where they came from.

    The conversation goes through the target's own chat template, and both models keep their caches
    between turns: each turn processes only its new tokens. Type /help in the chat for commands.

    Examples:

      specchat chat qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

      specchat chat ./target.gguf --draft ./draft.gguf --max-tokens 200 --system "Answer briefly."
    """
    from . import loader

    k_val = _check_common(k, temp, top_k, top_p, max_tokens, ctx_size, threads)
    if p_min is not None and not (0 <= p_min <= 1):
        raise BadInput(f"--draft-p-min must be in [0, 1] (got {p_min})")
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p)
    err = err_console()
    drafts = () if no_draft else tuple(draft or ()) or _default_draft(target, err, quiet=False)
    cfg = loader.LoadConfig(
        target=target,
        drafts=drafts,
        ctx_size=ctx_size,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        threads=threads,
        p_min=p_min if p_min is not None else default_p_min(SamplingParams(temperature=temp)),
        offline=offline or None,
        force=force,
        verbose=verbose,
        fixed_k=k_val is not None,
    )
    with err.status("loading models…") as status:
        loaded = loader.load(cfg, note=status.update, console=err)
    try:
        for w in loaded.warnings:
            err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
        session = ChatSession(
            LoadedEngine(loaded, seed=seed),
            system=system,
            k=k_val,
            params=params,
            p_min=p_min,
            max_tokens=max_tokens,
            seed=seed,
            names={"target": target, "drafts": ", ".join(d.name for d in loaded.drafters) or "none"},
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
        from .hub import cache_dirs

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
        self.sources = render.sources_for([d.source for d in session.engine.drafters])

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
                export_svg(reply.path, self.session.turns, sources=self.sources, system=self.session.system)
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
    console.print(render.legend(sources))
    if system:
        console.print(Text(f"system: {render.terminal_safe(system)}", style="dim"))
    for t in turns:
        console.print(Text.assemble(("you› ", "bold cyan"), render.terminal_safe(t.user)))
        answer = Text()
        for piece, src in zip(t.pieces, t.sources, strict=True):
            answer.append(render.terminal_safe(piece), style=render.STYLES[Source(src)])
        console.print(answer)
        if t.stats is not None:
            console.print(render.stats_line(t.stats))
    try:
        console.save_svg(os.fspath(path), title=title)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


# The shared option aliases come from cli.py, which imports this module while it registers commands:
# importing them last means this module is complete (register() defined) whichever is imported first.
# Typer reads the annotations only when the app runs.
from .cli import (  # noqa: E402
    CtxOpt,
    DraftGpuOpt,
    DraftOpt,
    ForceOpt,
    GpuOpt,
    KOpt,
    NoDraftOpt,
    OfflineOpt,
    PMinOpt,
    SeedOpt,
    SystemOpt,
    TargetArg,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
    _check_common,
    _default_draft,
)
