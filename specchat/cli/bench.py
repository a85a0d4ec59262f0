"""`specchat bench`: the command and its progress display; its report is `bench_report.py`.

The measuring lives in the `bench` package and prints nothing; this module parses options, loads models, shows
progress on stderr, and has the result drawn with Rich (`bench_report.render_report`) or prints it as JSON.
Results go to stdout, so `specchat bench ... --json > results.json` keeps a clean file while progress stays
on the terminal.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..decoding.settings import CTX_SIZE
from ..errors import BadInput
from ..llama.reference import find_program
from .bench_report import render_report
from .common import check_range, err_console, guarded, load_models, out_console
from .options import (
    CtxOpt,
    DraftGpuOpt,
    DraftOpt,
    DraftWindowOpt,
    ForceOpt,
    GpuOpt,
    MaxTokOpt,
    OfflineOpt,
    Options,
    PMinOpt,
    RpcOpt,
    StrictOpt,
    TargetArg,
    ThreadsOpt,
    TreeWidthOpt,
    VerboseOpt,
)

if TYPE_CHECKING:
    from ..bench.export import ServerModel
    from ..bench.run import BenchResult, Reference
    from ..bench.suite import BenchPrompt, Config, PreparedPrompt
    from ..models.loader import Loaded

EXPORT_FORMATS = ("llama-server", "vllm")
REPORT_WIDTH = 150  # columns when stdout is not a terminal


BENCH_HELP = "\n\n".join(
    [
        "Measure plain vs speculative decoding side by side, check exactness, predict GPU speedups.",
        "For every prompt it runs plain decoding, each drafter at each fixed k (--ks), each drafter under "
        "the cost model (auto) and all drafters together, interleaved so machine noise hits all alike. "
        "It reports decode tokens/s (median of --repeats), speedup vs plain, acceptance, tokens per target "
        "pass and acceptance by draft position.",
        "Greedy outputs are teacher-forced through the target one token at a time to confirm each token is "
        "its argmax (ties within 0.05 logits allowed); exits 1 if that audit fails.",
        "Without --draft, the target's recommended draft model and `ngram` are compared.",
        "Examples:",
        "specchat bench qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft ngram",
        "specchat bench ./target.gguf --draft ngram --prompts my_prompts.jsonl --json > bench.json",
        "specchat bench qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --export llama-server",
        "specchat bench qwen2.5-coder-1.5b --draft ngram --export vllm",
        "specchat bench qwen2.5-coder-1.5b --prompts tests/perf/copy_prompts.jsonl "
        "--llama-cpp ~/llama.cpp/build/bin",
    ]
)


def register(app: typer.Typer) -> None:
    """Add `bench` to the app (called by cli.py)."""
    app.command("bench", help=BENCH_HELP)(guarded(bench))


def bench(
    target: TargetArg,
    draft: DraftOpt = None,
    prompts: Annotated[
        str | None,
        typer.Option(
            "--prompts",
            metavar="FILE",
            help='JSONL file of {"name": ..., "prompt": ...} lines (default: the built-in suite: code, '
            "code edits, chat, creative, JSON, non-English).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document instead of tables.")
    ] = False,
    max_tokens: MaxTokOpt = 128,
    repeats: Annotated[
        int,
        typer.Option("--repeats", "-r", help="Runs of every configuration per prompt (medians reported)."),
    ] = 3,
    ks: Annotated[
        str | None,
        typer.Option(
            "--ks",
            help="Fixed draft lengths to measure for each drafter, comma-separated "
            "[default: 1,2,3,5, less those whose verify batch is not bit-exact on this backend].",
            show_default=False,
        ),
    ] = None,
    save: Annotated[
        str | None,
        typer.Option(
            "--save",
            metavar="FILE",
            help="Also write the JSON document to FILE (one run gives both the tables and the data).",
        ),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            metavar="FORMAT",
            help="Print the equivalent server command line and exit, loading and running nothing: "
            "FORMAT `llama-server` (llama.cpp) or `vllm` (vLLM's --speculative-config, for GPUs).",
        ),
    ] = None,
    p_min: PMinOpt = None,
    draft_window: DraftWindowOpt = None,
    tree_width: TreeWidthOpt = None,
    ctx_size: CtxOpt = CTX_SIZE,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = None,
    no_audit: Annotated[
        bool, typer.Option("--no-audit", help="Skip the exactness audit (saves one decode per output token).")
    ] = False,
    llama_cpp: Annotated[
        Path | None,
        typer.Option(
            "--llama-cpp",
            metavar="DIR",
            help="Also run llama.cpp's own n-gram modes (llama-speculative-simple from DIR) on the same "
            "prompts, interleaved, and report them as ratios to plain decoding in the same run.",
        ),
    ] = None,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    strict: StrictOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Measure plain vs speculative decoding side by side, check exactness, predict GPU speedups.

    The user-facing help is BENCH_HELP (Typer keeps a docstring's line breaks, which wrap badly).
    """
    from ..bench.suite import DEFAULT_KS, SUITE, default_configs, load_prompts, parse_ks

    # the bench is greedy: the sampling options keep their defaults
    opts = Options(
        target, drafts=tuple(draft or ()), p_min=p_min, max_tokens=max_tokens, ctx_size=ctx_size,
        gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=rpc, threads=threads, offline=offline,
        force=force, strict=strict, verbose=verbose, tree_width=tree_width, draft_window=draft_window,
    )  # fmt: skip
    check_range("--repeats", repeats, 1, 100)
    fixed_ks = parse_ks(ks) if ks is not None else None
    if export is not None and export not in EXPORT_FORMATS:
        raise BadInput(f"unknown --export format {export!r}", f"use one of: {', '.join(EXPORT_FORMATS)}")
    suite = load_prompts(prompts) if prompts is not None else list(SUITE)  # before any slow load
    if save is not None:
        _check_writable(save)
    drafts = opts.drafts_to_load() if opts.drafts else bench_drafts(target)
    err = err_console()

    if export is not None:
        _print_export(export, opts, drafts, err=err)
        return
    if not drafts:
        raise BadInput("nothing to compare plain decoding with", "give --draft MODEL and/or --draft ngram")
    ref_exe = find_program(llama_cpp) if llama_cpp is not None else None  # before any slow load

    loaded = load_models(opts.load_config(drafts), err)
    try:
        prepared = _prepare(loaded, suite, max_tokens, err)
        if fixed_ks is None:
            fixed_ks = DEFAULT_KS  # batches beyond the bit-exact size verify with the tie margin
        configs = default_configs([d.name for d in loaded.drafters], fixed_ks)
        if loaded.strict:  # every configuration is strict already: no separate strict run
            configs = [c for c in configs if not c.strict]
        meta = _meta(loaded, drafts)
        refs = _references(ref_exe, loaded, max_tokens, opts) if ref_exe is not None else {}
        result = _run_with_progress(
            loaded, prepared, configs, max_tokens, repeats, not no_audit, meta, err, refs
        )
        loaded_margin = loaded.tie_margin
    finally:
        loaded.close()

    doc = json.dumps(result.to_dict(), ensure_ascii=False)
    if save is not None:
        _save(save, doc)
    if as_json:
        print(doc)
    else:
        render_report(result, _report_console())
    if not result.audit_ok:
        bad = sum(len(a.failures) for a in result.audits)
        if result.worst_gap < loaded_margin:
            hint = (
                f"every gap is below {loaded_margin:.3f}, twice this machine's measured difference between "
                "batched and one-token logits: near-ties that llama.cpp's own arithmetic can flip"
            )
        else:
            hint = "this is a bug in speculative decoding; please report it with the --json output"
        raise BadInput(
            f"exactness audit failed: {bad} token(s) are not the target's greedy choice "
            f"(worst logit gap {result.worst_gap:.3f} > {result.tolerance})",
            hint,
        )


# --- steps of the command --------------------------------------------------------------------------------


def _check_writable(path: str) -> None:
    """Fail in a second, not after a half-hour run, when the --save file cannot be written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise BadInput(f"cannot write --save file {path}", "give a file path in an existing, writable folder")


def _save(path: str, doc: str) -> None:
    """Write the JSON document; a bad path is one error line (after the results are already shown)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(doc + "\n")
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


def _references(exe: Path, loaded: Loaded, max_tokens: int, opts: Options) -> dict[str, Reference]:
    """llama.cpp's n-gram modes as bench references: each runs its program on the prompt's text as
    specchat decodes it (template applied, special tokens written out), with the same threads."""
    from ..llama.reference import REFERENCE_MODES, run_reference
    from ..models.hardware import physical_cores

    target = loaded.target
    threads = opts.threads or physical_cores()

    def make(mode: tuple[str, ...]) -> Reference:
        def ref(prompt: PreparedPrompt) -> tuple[float, float]:
            run = run_reference(
                exe, target.path, target.detokenize(prompt.tokens), mode,
                max_tokens=max_tokens, threads=threads, ctx_size=opts.ctx_size,
            )  # fmt: skip
            return run.tokens_per_second, run.acceptance_rate

        return ref

    return {name: make(mode) for name, mode in REFERENCE_MODES.items()}


def bench_drafts(target: str) -> tuple[str, ...]:
    """What `bench` compares without --draft: the default drafts `run` would use (the recommended
    draft model and the registry's default model-free drafters), each alone and routed together."""
    from ..models.loader import default_drafts

    return default_drafts(target)


def _prepare(loaded: Loaded, suite: list[BenchPrompt], max_tokens: int, err: Console) -> list[PreparedPrompt]:
    """Each prompt through the target's chat template, checked to fit with its answer in the context."""
    from ..bench.suite import PreparedPrompt
    from ..models.loader import chat_prompt

    target = loaded.target
    out = []
    warned: set[str] = set()
    for w in loaded.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    for p in suite:
        tokens, warning = chat_prompt(target, p.conversation())
        if warning and warning not in warned:
            warned.add(warning)
            err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        if len(tokens) + max_tokens > target.n_ctx:
            raise BadInput(
                f"prompt {p.name!r} is {len(tokens)} tokens; with --max-tokens {max_tokens} it needs a "
                f"context of {len(tokens) + max_tokens} (have {target.n_ctx})",
                "raise --ctx-size or lower --max-tokens",
            )
        out.append(PreparedPrompt(p.name, p.category, tuple(tokens)))
    return out


def _meta(loaded: Loaded, drafts: tuple[str, ...]) -> dict[str, object]:
    """Where and with what the numbers were measured, for the JSON document and the report header."""
    from ..decoding.advice import calibration_report
    from ..decoding.planner import make_planner
    from ..llama.devices import backend_info

    target = loaded.target
    info = backend_info()
    return {
        "target": str(target.path),
        # the verify curve the auto planner drafts by (through the workers, for a split target)
        "cost_model": calibration_report(make_planner(loaded, None)) if loaded.drafters else [],
        "placement": getattr(loaded, "placement", ""),
        "draft_specs": list(drafts),
        "draft_models": [str(m.path) for m in loaded.draft_models],
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "threads": target.threads,
            "gpu_layers": target.gpu_layers,
            "gpu_offload": info.get("gpu_offload"),
            "llama_cpp_python": info.get("llama_cpp_python"),
            "system_info": info.get("system_info"),
        },
    }


def _run_with_progress(
    loaded: Loaded,
    prepared: list[PreparedPrompt],
    configs: list[Config],
    max_tokens: int,
    repeats: int,
    audit: bool,
    meta: dict[str, object],
    err: Console,
    references: dict[str, Reference] | None = None,
) -> BenchResult:
    """Run the benchmark with a progress bar on stderr when it is a terminal (silent otherwise)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.run import run_bench

    def go(progress: Callable[[int, int, str], None] | None = None) -> BenchResult:
        return run_bench(
            loaded.target,
            loaded.drafters,
            prepared,
            configs,
            max_tokens=max_tokens,
            repeats=repeats,
            audit=audit,
            meta=meta,
            progress=progress,
            tie_margin=loaded.tie_margin,
            exact_rows=loaded.exact_rows,
            references=references,
            strict=loaded.strict,
            backend=loaded.backend,
            verified=loaded.verified_rows,
        )

    if not err.is_terminal:
        return go()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("benchmark", total=None)

        def show(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(label))

        return go(show)


def _print_export(fmt: str, opts: Options, drafts: tuple[str, ...], *, err: Console) -> None:
    """The server command line on stdout (copy-pasteable), notes about it on stderr."""
    from ..bench.export import llama_server_command, vllm_command
    from ..decoding.planner import K_MAX
    from ..decoding.registry import NGRAM, is_model_free, make, split

    target = _server_model(opts.target)
    models = [_server_model(d) for d in drafts if not is_model_free(d)]
    ngrams = [d for d in drafts if is_model_free(d) and split(d)[0] == NGRAM]  # as given, options and all
    if fmt == "vllm":
        ngram = make(ngrams[0] if ngrams else NGRAM)  # its lookup window, for vLLM's equivalent method
        argv, notes = vllm_command(
            target,
            models,
            ngram=bool(ngrams),
            num_speculative_tokens=K_MAX,
            ngram_min=ngram.min_n,
            ngram_max=ngram.max_n,
            ctx_size=opts.ctx_size,
        )
    else:
        argv, notes = llama_server_command(
            target,
            models,
            ngram=bool(ngrams),
            draft_max=K_MAX,
            p_min=opts.draft_p_min,
            gpu_layers=opts.gpu_layers,
            draft_gpu_layers=opts.draft_gpu_layers,
            ctx_size=opts.ctx_size,
            threads=opts.threads,
        )
        notes.append("for vLLM's equivalent (--speculative-config), use --export vllm")
    own = [d for d in drafts if is_model_free(d) and d not in ngrams]  # model-free, with no counterpart there
    if own:
        notes.append(f"left out: {', '.join(own)} (specchat's own model-free drafters, no equivalent there)")
    print(shlex.join(argv))
    for note in notes:
        err.print(f"[dim]note: {escape(note)}[/]", highlight=False, soft_wrap=True)


def _server_model(spec: str) -> ServerModel:
    """A model reference as llama-server should see it: the local file when there is one (never
    downloading anything), else the Hub repository llama-server can fetch itself."""
    from ..bench.export import ServerModel
    from ..models.cache import cached_path
    from ..models.registry import resolve
    from ..models.registry_toml import load_registry

    ref = resolve(spec, load_registry())
    if ref.path is not None:
        return ServerModel(path=str(ref.path), label=spec)
    found = cached_path(ref)
    if found is not None:
        return ServerModel(path=str(found), label=spec)
    return ServerModel(repo=ref.repo, file=ref.file, quant=ref.quant, label=spec)


def _report_console() -> Console:
    """stdout at the terminal's width; when redirected (a file, a README), wide enough for every column."""
    console = out_console()
    if console.is_terminal:
        return console
    return Console(highlight=False, color_system=None, width=REPORT_WIDTH)
