"""`specchat chat`: the command. The terminal chat itself is `chat_ui`, the session logic
`decoding/session.py`'s `ChatSession`."""

from __future__ import annotations

from typing import Annotated

import typer

from ..decoding.settings import CTX_SIZE, SamplingParams
from .common import guarded
from .options import (
    DEFAULT_SAMPLING,
    CtxOpt,
    DraftGpuOpt,
    DraftOpt,
    DraftWindowOpt,
    ForceOpt,
    GpuOpt,
    KOpt,
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
    VerboseOpt,
    parse_k,
    parse_template_kwargs,
    sampling_options,
)


def register(app: typer.Typer) -> None:
    """Add `chat` to the app (called by cli.py)."""
    app.command("chat")(chat)


@guarded
@sampling_options()
def chat(
    target: TargetArg,
    draft: DraftOpt = None,
    no_draft: NoDraftOpt = False,
    k: KOpt = "auto",
    p_min: PMinOpt = None,
    draft_window: DraftWindowOpt = None,
    sampling: SamplingParams = DEFAULT_SAMPLING,  # one option per setting (sampling_options)
    seed: SeedOpt = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Stop each answer after this many tokens.")
    ] = 512,
    ctx_size: CtxOpt = CTX_SIZE,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = None,
    system: SystemOpt = None,
    chat_template_kwargs: TemplateKwargsOpt = None,
    chat_template_kwarg: TemplateKwargOpt = None,
    no_color: Annotated[
        bool, typer.Option("--no-color", help="No colours (also when NO_COLOR is set).")
    ] = False,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    strict: StrictOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Chat with a local model in the terminal; tokens are coloured by where they came from.

    The conversation goes through the target's own chat template, and both models keep their caches
    between turns: each turn processes only its new tokens. Type /help in the chat for commands.

    Examples:

      specchat chat qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

      specchat chat ./target.gguf --draft ./draft.gguf --max-tokens 200 --system "Answer briefly."
    """
    from .chat_ui import start_chat

    opts = Options(
        target, drafts=tuple(draft or ()), no_draft=no_draft, k=parse_k(k), p_min=p_min, params=sampling,
        seed=seed, max_tokens=max_tokens, ctx_size=ctx_size, gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers, rpc=rpc, threads=threads, system=system, offline=offline,
        force=force, strict=strict, verbose=verbose,
        template_kwargs=parse_template_kwargs(chat_template_kwargs, chat_template_kwarg),
        draft_window=draft_window,
    )  # fmt: skip
    start_chat(opts, no_color=no_color)
