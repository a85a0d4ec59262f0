"""Everything Rich: the coloured token stream, the legend, the stats line. Takes a Console, so tests
render into a recording console and the CLI/chat choose stdout, stderr or a file."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from .events import Source, Stats, Token

#: One colour per provenance. Green = the draft was right; red = the target had to correct it;
#: blue = the target's free extra token after a fully accepted round; magenta = n-gram lookup.
STYLES: dict[Source, str] = {
    Source.DRAFT: "green",
    Source.NGRAM: "magenta",
    Source.CORRECTION: "red",
    Source.BONUS: "blue",
    Source.TARGET: "",
}

LABELS: dict[Source, str] = {
    Source.DRAFT: "accepted from draft",
    Source.NGRAM: "accepted from n-gram lookup",
    Source.CORRECTION: "corrected by target",
    Source.BONUS: "added by target",
    Source.TARGET: "target (no draft)",
}


def legend(sources: tuple[Source, ...] = (Source.DRAFT, Source.CORRECTION, Source.BONUS)) -> Text:
    """One line naming each colour, printed once before the stream."""
    text = Text("legend: ", style="dim")
    for i, src in enumerate(sources):
        if i:
            text.append("  ")
        text.append(f"■ {LABELS[src]}", style=STYLES[src] or "default")
    return text


class TokenStream:
    """Prints token pieces as they arrive, each in its source's colour, without line breaks of its own."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.text = Text()

    def write(self, tok: Token) -> None:
        if not tok.text:
            return
        style = STYLES[tok.source]
        self.text.append(tok.text, style=style)
        self.console.print(Text(tok.text, style=style), end="", soft_wrap=True, highlight=False)
        self.console.file.flush()

    def end(self) -> None:
        self.console.print()


def stats_line(stats: Stats) -> Text:
    """The one-line summary after a run: the numbers users compare between settings."""
    parts = [
        f"{stats.generated_tokens} tokens",
        f"{stats.tokens_per_second:.1f} tok/s",
    ]
    if stats.drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%} ({stats.accepted}/{stats.drafted} drafted)")
    parts.append(f"{stats.tokens_per_pass:.2f} tokens/target pass")
    parts.append(f"prefill {stats.prefill_tokens} tok in {stats.prefill_seconds:.2f}s")
    if stats.stop_reason != "eog":
        parts.append(f"stopped: {stats.stop_reason.replace('_', ' ')}")
    return Text(" · ".join(parts), style="dim")
