"""specchat's command line. Each command parses options, calls the core, and hands events to render.

Heavy imports (llama_cpp, numpy, huggingface_hub) happen inside commands, so `specchat --help` is
instant and a typo in an option is reported before any model is touched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .cli_common import EXIT_INTERRUPTED, check_range, err_console, guarded, out_console
from .errors import BadInput

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

# --- options shared by run / chat / bench -------------------------------------------------------------
TargetArg = Annotated[
    str,
    typer.Argument(
        help="Target model: an alias from `specchat models`, a .gguf path, hf:ORG/REPO/FILE.gguf "
        "or ORG/REPO:QUANT."
    ),
]
DraftOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--draft",
        "-d",
        help="Draft model (same forms as TARGET), or `ngram` for model-free prompt lookup. "
        "Repeat to give several.",
    ),
]
NoDraftOpt = Annotated[
    bool, typer.Option("--no-draft", help="Plain decoding with the target alone (the baseline).")
]
KOpt = Annotated[
    str,
    typer.Option(
        "--draft-tokens", "-k", help="Tokens drafted per round: a number (0 = none) or `auto` (cost model)."
    ),
]
PMinOpt = Annotated[
    float | None,
    typer.Option(
        "--draft-p-min",
        help="Stop drafting when the draft's confidence falls below this "
        "(default: 0.75 greedy, 0.5 sampling).",
    ),
]
TempOpt = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 = greedy (deterministic).")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Sample from the k most likely tokens (0 = off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass in (0, 1] (1 = off).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for sampling (repeatable runs).")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="Stop after this many generated tokens.")]
CtxOpt = Annotated[int, typer.Option("--ctx-size", "-c", help="Context window in tokens (prompt + output).")]
GpuOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        help="Target layers to offload to the GPU (default: all if the build can offload, else 0).",
    ),
]
DraftGpuOpt = Annotated[
    int | None, typer.Option("--draft-gpu-layers", help="Draft layers to offload (default: as --gpu-layers).")
]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", "-t", help="CPU threads (default: physical cores).")
]
SystemOpt = Annotated[str | None, typer.Option("--system", help="System prompt for the chat template.")]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Never touch the network; use cached models only.")
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Load even if the fit check says the models will not fit.")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log and tracebacks.")]


def _check_common(
    k: str, temp: float, top_k: int, top_p: float, max_tokens: int, ctx_size: int, threads: int | None
) -> int | None:
    """Validate numbers before anything slow happens; returns k as int, or None for auto."""
    if k != "auto":
        try:
            k_val: int | None = int(k)
        except ValueError:
            raise BadInput(f"-k/--draft-tokens must be a number >= 0 or `auto` (got {k!r})") from None
        check_range("-k/--draft-tokens", k_val, 0, 64)
    else:
        k_val = None
    check_range("--temp", temp, 0)
    if temp != temp:  # NaN
        raise BadInput("--temp must be a number >= 0")
    check_range("--top-k", top_k, 0)
    if not (0 < top_p <= 1):
        raise BadInput(f"--top-p must be in (0, 1] (got {top_p}); 1 disables it")
    check_range("--max-tokens", max_tokens, 1)
    check_range("--ctx-size", ctx_size, 16)
    check_range("--threads", threads, 1)
    return k_val


@app.command()
@guarded
def run(
    target: TargetArg,
    prompt: Annotated[
        str | None, typer.Option("--prompt", "-p", help="The prompt; read from stdin when omitted.")
    ] = None,
    draft: DraftOpt = None,
    no_draft: NoDraftOpt = False,
    k: KOpt = "auto",
    p_min: PMinOpt = None,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    seed: SeedOpt = None,
    max_tokens: MaxTokOpt = 256,
    ctx_size: CtxOpt = 4096,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    threads: ThreadsOpt = None,
    system: SystemOpt = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Use the prompt as-is, without the chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text, tokens, sources, stats).")
    ] = False,
    no_color: Annotated[
        bool,
        typer.Option(
            "--no-color", help="No colours (also when NO_COLOR is set or stdout is not a terminal)."
        ),
    ] = False,
    save_svg: Annotated[
        Path | None, typer.Option("--save-svg", help="Also save the coloured answer as an SVG picture.")
    ] = None,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Generate one answer with speculative decoding and show where each token came from.

    Examples:

      specchat run qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b -p "Write a quicksort in Python"

      cat notes.txt | specchat run ./target.gguf --draft ./draft.gguf --temp 0.7 --seed 1

      specchat run target.gguf --no-draft -p "..." --json     # the plain-decoding baseline
    """
    import numpy as np

    from . import loader, render, tuning
    from .drafters import default_p_min
    from .sampling import SamplingParams
    from .speculative import Settings, Tally, generate

    k_val = _check_common(k, temp, top_k, top_p, max_tokens, ctx_size, threads)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p)
    if p_min is not None and not (0 <= p_min <= 1):
        raise BadInput(f"--draft-p-min must be in [0, 1] (got {p_min})")
    err = err_console()
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            if sys.stdin is None or as_json or raw:
                raise BadInput("no prompt given", "pass -p TEXT, or pipe the prompt on stdin")
            from .cli_chat import chat  # no prompt on a terminal: open the interactive chat

            return chat(
                target, draft=draft, no_draft=no_draft, k=k, p_min=p_min, temp=temp, top_k=top_k,
                top_p=top_p, seed=seed, max_tokens=max_tokens, ctx_size=ctx_size, gpu_layers=gpu_layers,
                draft_gpu_layers=draft_gpu_layers, threads=threads, system=system, no_color=no_color,
                offline=offline, force=force, verbose=verbose,
            )  # fmt: skip
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise BadInput("the prompt is empty", "pass -p TEXT, or pipe the prompt on stdin")

    drafts = tuple(draft or ())
    if not no_draft and not drafts:
        drafts = _default_draft(target, err, quiet=as_json)
    if no_draft:
        drafts = ()
    cfg = loader.LoadConfig(
        target=target,
        drafts=drafts,
        ctx_size=ctx_size,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        threads=threads,
        p_min=p_min if p_min is not None else default_p_min(params),
        offline=offline or None,
        force=force,
        verbose=verbose,
        fixed_k=k_val is not None,
    )
    status = err.status("loading models…") if not as_json else None
    if status is not None:
        status.start()
    try:
        loaded = loader.load(cfg, note=lambda m: status.update(m) if status else None, console=err)
    finally:
        if status is not None:
            status.stop()
    try:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        tokens, warning = loader.chat_prompt(loaded.target, messages, raw=raw)
        for w in [*loaded.warnings, *([warning] if warning else [])]:
            err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
        planner = tuning.make_planner(loaded, k_val, seed=seed)
        rng = np.random.default_rng(seed)
        tally = Tally()
        sources = render.sources_for([d.source for d in loaded.drafters])
        if not as_json and loaded.drafters:
            err.print(render.legend(sources))
        gen = generate(
            loaded.target,
            tokens,
            drafters=loaded.drafters,
            planner=planner,
            settings=Settings(
                max_tokens=max_tokens,
                params=params,
                tie_margin=loaded.tie_margin,
                exact_rows=loaded.exact_rows,
            ),
            rng=rng,
            tally=tally,
        )
        stream = render.TokenStream(out_console(no_color)) if not as_json else None
        shown = render.consume(gen, stream, tally)
        why = getattr(planner, "explain", lambda _names: None)([d.name for d in loaded.drafters])
        for note in [*shown.notices, *([why] if why and not as_json else [])]:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        stats = shown.stats
        if save_svg is not None:
            from .chat import Turn
            from .cli_chat import export_svg

            export_svg(save_svg, [Turn.from_shown(prompt, shown)], sources=sources, system=system)
            err.print(f"[dim]saved {escape(str(save_svg))}[/]")
        if as_json:
            doc = {
                "text": shown.text,
                "prompt_tokens": tokens,
                "tokens": shown.ids,
                "sources": shown.sources,
                "stats": stats.to_dict(),
                "target": str(loaded.target.path),
                "drafts": [d.name for d in loaded.drafters],
            }
            print(json.dumps(doc, ensure_ascii=False))
        else:
            err.print(render.stats_line(stats), soft_wrap=True)
        if shown.interrupted:
            raise typer.Exit(EXIT_INTERRUPTED)
    finally:
        loaded.close()


def _default_draft(target: str, err: object, *, quiet: bool) -> tuple[str, ...]:
    """The registry's recommended draft for an alias target, announced in one line."""
    from .registry import load_registry, resolve

    reg = load_registry()
    ref = resolve(target, reg)  # hf: and ORG/REPO:QUANT targets that are in the registry count too
    rec = reg.recommended_draft(ref.alias) if ref.alias else None
    if rec is None:
        return ()
    if not quiet:
        err.print(f"[dim]using the recommended draft {rec} (--no-draft for plain decoding)[/]")  # type: ignore[attr-defined]
    return (rec,)


def _register_more() -> None:
    """Commands that live in their own modules. Imported here, after this module's option aliases
    exist, because chat and bench reuse them."""
    from . import cli_bench, cli_chat, cli_doctor, cli_models

    for mod in (cli_models, cli_doctor, cli_chat, cli_bench):
        mod.register(app)


_register_more()


def main() -> None:
    """Console-script entry point."""
    app()
