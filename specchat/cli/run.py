"""`specchat run`: one answer, streamed in colour (or one JSON object), then the stats line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..decoding.settings import CTX_SIZE, MAX_TOKENS, SamplingParams
from ..errors import BadInput
from .common import EXIT_INTERRUPTED, err_console, guarded, load_models, out_console
from .options import (
    DEFAULT_SAMPLING,
    CtxOpt,
    DraftGpuOpt,
    DraftOpt,
    DraftWindowOpt,
    ForceOpt,
    GpuOpt,
    KOpt,
    MaxTokOpt,
    NoColorOpt,
    NoDraftOpt,
    OfflineOpt,
    Options,
    PMinOpt,
    RpcOpt,
    SeedOpt,
    StrictOpt,
    SystemOpt,
    TargetArg,
    TemplateKwargOpt,
    TemplateKwargsOpt,
    ThreadsOpt,
    TreeWidthOpt,
    VerboseOpt,
    parse_k,
    parse_template_kwargs,
    sampling_options,
)


def register(app: typer.Typer) -> None:
    """Add `run` to the app (called by cli.py)."""
    app.command("run")(run)


@guarded
@sampling_options()
def run(
    target: TargetArg,
    prompt: Annotated[
        str | None, typer.Option("--prompt", "-p", help="The prompt; read from stdin when omitted.")
    ] = None,
    draft: DraftOpt = None,
    no_draft: NoDraftOpt = False,
    k: KOpt = "auto",
    p_min: PMinOpt = None,
    draft_window: DraftWindowOpt = None,
    tree_width: TreeWidthOpt = None,
    sampling: SamplingParams = DEFAULT_SAMPLING,  # one option per setting (sampling_options)
    seed: SeedOpt = None,
    max_tokens: MaxTokOpt = MAX_TOKENS,
    ctx_size: CtxOpt = CTX_SIZE,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = None,
    system: SystemOpt = None,
    chat_template_kwargs: TemplateKwargsOpt = None,
    chat_template_kwarg: TemplateKwargOpt = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Use the prompt as-is, without the chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text, tokens, sources, stats).")
    ] = False,
    no_color: NoColorOpt = False,
    save_svg: Annotated[
        Path | None, typer.Option("--save-svg", help="Also save the coloured answer as an SVG picture.")
    ] = None,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    strict: StrictOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Generate one answer with speculative decoding and show where each token came from.

    Examples:

      specchat run qwen2.5-coder-1.5b -p "Write a quicksort in Python"   # recommended draft + n-gram

      specchat run qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b -p "..."   # only this draft

      cat notes.txt | specchat run ./target.gguf --draft ./draft.gguf --temp 0.7 --seed 1

      specchat run target.gguf --no-draft -p "..." --json     # the plain-decoding baseline
    """
    opts = Options(
        target, drafts=tuple(draft or ()), no_draft=no_draft, k=parse_k(k), p_min=p_min, params=sampling,
        seed=seed, max_tokens=max_tokens, ctx_size=ctx_size, gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers, rpc=rpc, threads=threads, system=system, offline=offline,
        force=force, strict=strict, verbose=verbose, tree_width=tree_width,
        template_kwargs=parse_template_kwargs(chat_template_kwargs, chat_template_kwarg),
        draft_window=draft_window,
    )  # fmt: skip
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            if sys.stdin is None or as_json or raw:
                raise BadInput("no prompt given", "pass -p TEXT, or pipe the prompt on stdin")
            from .chat_ui import start_chat  # no prompt on a terminal: open the interactive chat

            return start_chat(opts, no_color=no_color)
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise BadInput("the prompt is empty", "pass -p TEXT, or pipe the prompt on stdin")
    generate_one(opts, prompt, raw=raw, as_json=as_json, no_color=no_color, save_svg=save_svg)


def generate_one(
    opts: Options, prompt: str, *, raw: bool, as_json: bool, no_color: bool, save_svg: Path | None
) -> None:
    """Load, generate one answer to `prompt`, show it (or print it as JSON), and free the models."""
    import numpy as np

    from ..decoding.advice import acceptance_advice, calibration_report
    from ..decoding.events import sources_for
    from ..decoding.loop import Tally
    from ..decoding.planner import make_planner
    from ..decoding.session import answer_events
    from ..models import loader
    from . import render

    err = err_console()
    announce = None if as_json else (lambda line: err.print(f"[dim]{escape(line)}[/]", soft_wrap=True))
    loaded = load_models(opts.load_config(opts.drafts_to_load(announce)), err, quiet=as_json)
    try:
        system = opts.system
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        tokens, warning = loader.chat_prompt(
            loaded.target, messages, raw=raw, template_kwargs=opts.template_kwargs
        )
        for w in [*loaded.warnings, *([warning] if warning else [])]:
            err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
        planner = make_planner(loaded, opts.k, seed=opts.seed)
        if opts.verbose:
            for line in calibration_report(planner):
                err.print(f"[dim]{escape(line)}[/]", highlight=False, soft_wrap=True)
        rng = np.random.default_rng(opts.seed)
        tally = Tally()
        gen = answer_events(  # settings the model cannot take (a logit_bias id) fail here, before output
            loader.LoadedEngine(loaded),
            tokens,
            drafters=loaded.drafters,
            planner=planner,
            params=opts.params,
            max_tokens=opts.max_tokens,
            rng=rng,
            tally=tally,
        )
        sources = sources_for([d.source for d in loaded.drafters])
        if not as_json and loaded.drafters:
            err.print(render.legend(sources))
        stream = render.TokenStream(out_console(no_color)) if not as_json else None
        shown = render.consume(gen, stream, tally)
        why = getattr(planner, "explain", lambda _names: None)([d.name for d in loaded.drafters])
        advice = acceptance_advice(shown.stats, [m.name for m in loaded.draft_models], opts.target)
        for note in [*shown.notices, *(n for n in (why, advice) if n and not as_json)]:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        stats = shown.stats
        if save_svg is not None:
            from ..decoding.session import Turn

            render.export_svg(save_svg, [Turn.from_shown(prompt, shown)], sources=sources, system=system)
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
