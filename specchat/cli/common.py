"""Plumbing shared by every command: consoles, the user-error guard, option validation.

Why a guard: every failure a user can cause (bad numbers, missing files, incompatible pairs, offline)
must end as ONE line on stderr and a non-zero exit, never a traceback; Ctrl-C exits 130; a closed
pipe (`| head`) exits quietly. Tracebacks appear only with --verbose or SPECCHAT_DEBUG=1.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import BadInput, SpecchatError

if TYPE_CHECKING:
    from ..decoding.settings import SamplingParams
    from ..models.loader import LoadConfig, Loaded

F = TypeVar("F", bound=Callable[..., Any])

EXIT_INTERRUPTED = 130


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


class _StdoutConsole(Console):
    """A Console for stdout whose closed pipe ends the command like every other closed pipe.

    Rich's own reaction to EPIPE is `SystemExit(1)` from deep inside print(), which skips `guarded`:
    `specchat run ... | head -c 20` then exited 1 while the same run with --json exited 0. Raising
    BrokenPipeError instead lets `guarded` quiet stdout and exit 0 in both cases.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True  # later prints (the stream's final newline) are dropped, not retried
        raise BrokenPipeError("stdout was closed by the reader")


def out_console(no_color: bool = False) -> Console:
    """stdout console; Rich itself drops colour when stdout is not a terminal or NO_COLOR is set."""
    return _StdoutConsole(highlight=False, color_system=None if no_color else "auto", soft_wrap=True)


def fail_line(err: SpecchatError) -> str:
    """The single line shown for a user error: what is wrong — how to fix it.

    Messages quote file names, metadata and template errors, which come from untrusted files: Rich
    markup is escaped and control characters (ESC sequences that would drive the terminal, newlines
    that would break the one line) are shown as visible escapes.
    """
    from ..terminal import terminal_safe

    def safe(text: str) -> str:
        return escape(terminal_safe(text).replace("\n", "\\n"))

    msg = f"[bold red]error:[/] {safe(err.message)}"
    if err.hint:
        msg += f" [dim]— {safe(err.hint)}[/]"
    return msg


def guarded(fn: F) -> F:
    """Decorate a Typer command so user errors, Ctrl-C and closed pipes end cleanly."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("verbose")) or os.environ.get("SPECCHAT_DEBUG") == "1"
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except SpecchatError as err:
            if debug:
                traceback.print_exc()
            err_console().print(fail_line(err), soft_wrap=True)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            err_console().print("[yellow]interrupted[/]")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            _quiet_stdout()
            raise typer.Exit(0) from None

    return wrapper  # type: ignore[return-value]


def _quiet_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so Python's exit-time flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def check_range(
    name: str, value: float | int | None, lo: float | None = None, hi: float | None = None
) -> None:
    """Validate a numeric option with a one-line message (Click's own errors are a multi-line box)."""
    if value is None:
        return
    if lo is not None and value < lo:
        raise BadInput(f"{name} must be >= {lo} (got {value})")
    if hi is not None and value > hi:
        raise BadInput(f"{name} must be <= {hi} (got {value})")


def load_models(cfg: LoadConfig, err: Console, *, quiet: bool = False) -> Loaded:
    """`loader.load` with a spinner on stderr showing its progress notes (none when `quiet`, as for
    --json, whose stderr stays free of anything but warnings and errors)."""
    from ..models import loader

    if quiet:
        return loader.load(cfg, console=err)
    with err.status("loading models…") as status:
        loaded = loader.load(cfg, note=status.update, console=err)
    placement = getattr(loaded, "placement", "")  # (a test's stand-in may not say)
    if placement:  # a target split over RPC workers: which machine holds which layers
        err.print(f"[dim]target split: {escape(placement)}[/]", soft_wrap=True)
    return loaded


def check_vocab(params: SamplingParams, n_vocab: int) -> None:
    """One line naming the flag when a per-token setting (`--logit-bias`) names a token the loaded
    model lacks: checked once the model is loaded, before the first answer (or request)."""
    from ..decoding.settings import SettingError

    try:
        params.check_vocab(n_vocab)
    except SettingError as exc:
        raise BadInput(str(exc)) from None
