"""specchat's command line: the one Typer app, and the command modules registered on it.

Owns one module per command (run, chat, bench, serve, models, doctor), the options they share
(`options.Options`, the Typer option types), the shared helpers (`common`: consoles, error lines,
loading), the interactive chat UI (`chat_ui`) and everything Rich (`render`). Each command parses its
options into `options.Options`, calls the core, and hands events to render. Heavy imports (llama_cpp,
numpy, huggingface_hub) happen inside commands, so `specchat --help` is instant and a typo in an
option is reported before any model is touched.

May import every other part of specchat; nothing in specchat imports the CLI (only `__main__`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from . import bench, chat, doctor, models, run, serve, worker

app = typer.Typer(
    name="specchat",
    help=(
        "Faster local LLM generation with exact speculative decoding on llama.cpp.\n\n"
        "A small draft model proposes tokens, the target model checks them all in one pass: the text is "
        "exactly what the target alone would write, only sooner. Tokens are coloured by where they came "
        "from: accepted from the draft, corrected by the target, or added by the target."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(wanted: bool) -> None:
    """`--version`: print the installed version and stop before any command runs."""
    if wanted:
        typer.echo(f"specchat {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    # the app's own options (the commands have theirs): Typer runs this before any command
    return None


def _register_commands(app: typer.Typer) -> None:
    """Each command lives in its own module and depends only on shared ones (options, common, ...),
    never on this module or on another command's: this module imports them, nothing imports it."""
    for module in (run, models, doctor, chat, bench, serve, worker):
        module.register(app)


_register_commands(app)


def main() -> None:
    """Console-script entry point."""
    app()
