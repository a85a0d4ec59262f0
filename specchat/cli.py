"""specchat's command line: the one Typer app, and the command modules registered on it.

Each command (cli_run, cli_chat, cli_bench, cli_serve, cli_models, cli_doctor) parses its options into the
shared `cli_options.Options`, calls the core, and hands events to render. Heavy imports (llama_cpp,
numpy, huggingface_hub) happen inside commands, so `specchat --help` is instant and a typo in an
option is reported before any model is touched.
"""

from __future__ import annotations

import typer

from . import cli_bench, cli_chat, cli_doctor, cli_models, cli_run, cli_serve

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


def _register_commands(app: typer.Typer) -> None:
    """Each command lives in its own module and depends only on shared ones (cli_options, cli_common,
    ...), never on this module or on another command's: this module imports them, nothing imports it."""
    for module in (cli_run, cli_models, cli_doctor, cli_chat, cli_bench, cli_serve):
        module.register(app)


_register_commands(app)


def main() -> None:
    """Console-script entry point."""
    app()
