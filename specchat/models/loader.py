"""From command-line references to ready models: resolve, validate, fit-check, load, pair-check.

Shared by `run`, `chat` and `bench`, so each command only parses options and renders events. The
order matters for users: cheap checks (file exists, is a whole GGUF, fits in memory) come before the
seconds-long load, so mistakes are reported within a second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decoding import registry
from ..decoding.block import BlockDrafter
from ..decoding.drafters import Drafter, HeadDrafter, ModelDrafter
from ..decoding.settings import CTX_SIZE, DRAFT_WINDOW
from ..decoding.tree import TREE_BRANCHES
from ..errors import BadInput, ContextFull, ModelFileError
from ..llama.devices import supports_gpu_offload
from ..llama.dflash import DFlashBlock
from ..llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions
from ..llama.rollback import TARGET_SNAPSHOTS
from ..llama.template import render_chat
from . import hardware
from .gguf import read_gguf
from .heads import (
    block_pass_share,
    check_dflash_file,
    check_eagle3_file,
    default_head,
    head_file_spec,
)
from .pair import check_pair
from .registry import ModelRef
from .workers import lent, place, probe_workers, workers_key

if TYPE_CHECKING:
    from ..decoding.constraint import GrammarSpec
    from ..decoding.loop import Planner
    from ..llama.eagle3 import Eagle3Head
    from ..llama.grammar import Grammar
    from ..llama.mtp import AssistantHead, MtpHead
    from ..llama.rpc_wire import WorkerInfo


@dataclass(frozen=True, slots=True)
class LoadConfig:
    target: str
    drafts: tuple[str, ...] = ()
    ctx_size: int = CTX_SIZE
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    threads: int | None = None
    draft_threads: int | None = None
    p_min: float = 0.75
    offline: bool | None = None
    force: bool = False
    verbose: bool = False
    #: --strict: greedy output equal to one-token decoding token for token (loop.Settings)
    strict: bool = False
    #: --rpc: llama.cpp RPC workers (`HOST:PORT`) the target's layers are split over (llama/rpc.py)
    rpc: tuple[str, ...] = ()
    #: a split target keeps its output layer on this machine (llama/output_layer.py), so its logits
    #: are computed here and only hidden states cross the network; False leaves it where llama.cpp
    #: puts it, on the last worker
    local_output: bool = True
    #: --tree-width: side nodes a draft model's token tree may have per round (0: chains only)
    tree_width: int = 0
    #: --draft-window: recent tokens a draft model attends to, besides the first few (llama/window.py;
    #: 0: the whole context)
    draft_window: int = DRAFT_WINDOW


@dataclass(slots=True)
class Loaded:
    target: LlamaModel
    drafters: list[Drafter]
    warnings: list[str] = field(default_factory=list)
    draft_models: list[LlamaModel] = field(default_factory=list)
    #: the drafters that read the target's hidden states (an MTP head, an EAGLE-3 head): closed with it
    heads: list[MtpHead | AssistantHead | Eagle3Head | DFlashBlock] = field(default_factory=list)
    tie_margin: float = 0.0  # greedy verification: see decoding.loop.Settings
    exact_rows: int = 0  # ditto
    strict: bool = False  # ditto
    backend: str = ""  # llama.cpp's system info and build: keys the calibration caches (see make_planner)
    #: verify batches of up to this many rows shown bit-exact by the build's invariance probe (0: not
    #: shown, or the target is not on the CPU the probe ran on); calibration confirms it on the target
    verified_rows: int = 0
    #: where a target split over RPC workers has its layers (one line), "" for a target on this machine
    placement: str = ""

    def close(self) -> None:
        for h in self.heads:
            h.close()
        for m in self.draft_models:
            m.close()
        self.target.close()


@dataclass(slots=True)
class LoadedEngine:
    """`decoding.session.Engine` over models from `load`: the GGUF chat template and the real planner
    (what the chat session code is handed, by every front end that has one)."""

    loaded: Loaded
    seed: int | None = None

    @property
    def target(self) -> LlamaModel:
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

    @property
    def strict(self) -> bool:
        return self.loaded.strict

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str | None]:
        """The conversation in the target's chat template; `tools` and `template_kwargs` (extra
        variables such as `enable_thinking`) are handed to the template."""
        return chat_prompt(self.loaded.target, messages, tools=tools, template_kwargs=template_kwargs)

    def render_text(self, text: str) -> tuple[list[int], str | None]:
        """A plain-text prompt (no chat template), e.g. for the server's /v1/completions."""
        return chat_prompt(self.loaded.target, [{"role": "user", "content": text}], raw=True)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        """The target's token ids for `text` (the server's /tokenize; no template, no length check)."""
        return self.loaded.target.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens` with control tokens written out (`<|im_end|>`), as llama-server's
        /detokenize gives it: a client rebuilding a prompt needs the markers, which generated text
        (token_bytes) leaves out."""
        target = self.loaded.target
        raw = b"".join(
            target.token_text(t).encode() if target.is_control(t) else target.token_bytes(t) for t in tokens
        )
        return raw.decode("utf-8", errors="replace")

    def tokenizer_facts(self) -> dict[str, object]:
        """What /tokenizer_info reports: vocabulary size, context, special tokens, chat template."""
        target = self.loaded.target
        facts = target.vocab_facts()
        pad_meta = target.meta("tokenizer.ggml.padding_token_id")
        pad = int(pad_meta) if pad_meta is not None and pad_meta.strip().isdigit() else -1
        out: dict[str, object] = {
            "n_vocab": facts.n_vocab,
            "n_ctx": target.n_ctx,
            "add_bos": facts.add_bos,
            "add_eos": facts.add_eos,
            "chat_template": target.chat_template,
        }
        for name, tid in (("bos", facts.bos), ("eos", facts.eos), ("pad", pad)):
            valid = 0 <= tid < facts.n_vocab
            out[f"{name}_id"] = tid if valid else -1
            out[f"{name}_text"] = target.token_text(tid) if valid else None
        return out

    def planner(self, k: int | None, *, seed: int | None = None) -> Planner:
        """A planner for `-k k`; `seed` (default: this engine's) makes its choices repeatable."""
        from ..decoding.planner import make_planner

        return make_planner(self.loaded, k, seed=seed if seed is not None else self.seed)

    def constraint(self, spec: GrammarSpec) -> Grammar:
        """A request's grammar (or JSON schema) compiled for the target's vocabulary (BadInput when
        it cannot be); each answer walks `start()`, the caller closes it (server/worker.py)."""
        from ..llama.grammar import compile_grammar

        return compile_grammar(self.loaded.target, spec)


def default_drafts(target: str) -> tuple[str, ...]:
    """The drafts a target gets when the user names none: the registry's recommended draft model, the
    model's own MTP head where its file carries one (NextN layers: the registry says so, or the local
    file's header does) or an EAGLE-3 head the registry names or that lies beside it, and the
    model-free drafters marked `default` in decoding/registry.py (n-gram prompt lookup), routed per
    round by the auto planner.

    Both kinds, because they win on different text: n-gram lookup is free and right on whatever
    copies the context (edits, rewrites, chat revisions), a draft model on fresh text where the verify
    batch is cheap (GPU/Metal). The planner drafts with neither where neither pays. A target outside
    the registry gets the model-free ones alone. The one place that decides it, for every command and
    the Python API. hf: and ORG/REPO:QUANT targets that are in the registry count too, since
    `resolve` finds their alias.
    """
    from .registry import resolve
    from .registry_toml import load_registry

    reg = load_registry()
    ref = resolve(target, reg)
    rec = reg.recommended_draft(ref.alias) if ref.alias else None
    own = default_head(ref)
    return (*([rec] if rec else []), *([own] if own else []), *registry.defaults())


def locate(spec: str, *, offline: bool | None, console: object | None = None) -> Path:
    """A model reference (alias, path, hf:, ORG/REPO:QUANT) to a local file, downloading if allowed."""
    from . import hub
    from .registry import resolve
    from .registry_toml import load_registry

    ref = resolve(spec, load_registry())
    return hub.locate(ref, offline=offline, console=console)


def load(
    cfg: LoadConfig, *, note: Callable[[str], None] = lambda _m: None, console: object | None = None
) -> Loaded:
    """Resolve and load the target and its drafters. `note` receives one-line progress messages.

    A llama.cpp build recorded as failing its self-check (see buildcheck) is refused first: it would
    crash or compute garbage on the first quantised matmul, after a possibly long download. A stock
    llama-cpp-python (not specchat's patched build) is used, with one line in `warnings` saying so.
    """
    from ..llama.buildcheck import build_identity, build_warning, refuse_known_bad

    ident = build_identity()  # the installed build: refused if recorded bad, keys the calibration below
    refuse_known_bad(ident)
    workers = probe_workers(cfg.rpc, same_build=not cfg.force)  # an unusable worker: one line, first
    stock = build_warning(ident)  # a stock llama-cpp-python: said once, with how to get the patched one
    for spec in cfg.drafts:
        if registry.is_model_free(spec):
            registry.make(spec)  # its options refused before anything loads; built with the target below
    model_specs = [d for d in cfg.drafts if not registry.is_model_free(d) and not registry.is_target_head(d)]
    head_specs = [d for d in cfg.drafts if registry.is_target_head(d)]
    if len(head_specs) > 1:
        raise BadInput(
            f"--draft {head_specs[0]} and --draft {head_specs[1]} both read the target's hidden states; "
            "a run takes one of them",
            "keep one of them (other drafters, model-free ones included, go with either)",
        )
    head_spec = head_specs[0] if head_specs else None
    head_kind = registry.split(head_spec)[0] if head_spec is not None else None
    # a drafter that reads the target: the model's NextN layers, or a file of its own (Gemma 4's
    # assistant, an EAGLE-3 head) fetched and checked like a draft
    head_file = head_file_spec(_resolve(cfg.target), head_spec) if head_spec is not None else None
    if head_file is not None:
        model_specs.append(head_file)
    fit_before_download(
        [_resolve(s) for s in [cfg.target, *model_specs]],
        ctx_size=cfg.ctx_size,
        gpu_layers=cfg.gpu_layers,
        force=cfg.force,
        offline=cfg.offline,
        workers=lent(workers),
    )
    paths = {spec: locate(spec, offline=cfg.offline, console=console) for spec in [cfg.target, *model_specs]}
    infos = {spec: read_gguf(p) for spec, p in paths.items()}  # not-a-GGUF / truncated: one clear line
    if head_kind == registry.EAGLE3 and head_file is not None:
        check_eagle3_file(infos[head_file], infos[cfg.target])  # before the target's load, not after
    if head_kind in registry.BLOCK_DRAFTERS and head_file is not None:
        check_dflash_file(infos[head_file], infos[cfg.target], dspark=head_kind == registry.DSPARK)
    _fit_check(cfg, paths, infos, workers)
    note(f"loading {paths[cfg.target].name}")
    on_cpu = cfg.gpu_layers == 0 or not supports_gpu_offload()
    from ..llama.buildcheck import verified_exact_rows

    # verify batches shown bit-exact on this build, attention with V in f16 (llama.cpp's default) and
    # in bf16 past 512 cells included (llama/invariance.py); 0: not shown, or not on the CPU it ran on
    verified = verified_exact_rows(ident) if on_cpu else 0
    split = place(workers, infos[cfg.target], cfg.gpu_layers, cfg.local_output) if workers else None
    if split is not None:
        note(f"loading {paths[cfg.target].name}: {split.summary}")
    target = LlamaModel(
        paths[cfg.target],
        LoadOptions(
            n_ctx=cfg.ctx_size,
            gpu_layers=split.gpu_layers if split is not None else cfg.gpu_layers,
            devices=split.devices if split is not None else None,
            workers=tuple(str(w.endpoint) for w in workers),
            local_output=split is not None and split.local_output,
            threads=cfg.threads,
            verbose=cfg.verbose,
            # One target, one output: the target loads the same with or without drafters, so
            # `--no-draft` and a speculative run give the same greedy text token for token. Repacked
            # weights stay on (faster single-token decoding, and their GEMM makes batches of 4+
            # rows cheap). V stays in f16, llama.cpp's default and its fastest prefill (bf16 V
            # prefills slower), where the build's probe showed f16 attention
            # bit-exact at every verify width (the patched build: patch 0003); on a CPU build
            # without that proof V goes to bf16, with which stock llama.cpp runs one row as it runs
            # several (see LoadOptions). Batches beyond the bit-exact size use the tie margin.
            repack=True,
            type_v=GGML_TYPE_BF16 if on_cpu and not verified else None,
            # a recurrent or hybrid target keeps its state after each of a verify batch's last
            # tokens, so most rejected drafts are taken back for free (llama/rollback.py); the same
            # with or without drafters, as above
            snapshots=TARGET_SNAPSHOTS,
            # the NextN layers, only where the MTP drafter will use them (they are not part of the
            # target's own forward pass: its output is the same either way)
            load_mtp=head_kind == registry.MTP and head_file is None,
            # room for token trees (decoding/tree.py), with or without drafters, as above
            tree_branches=TREE_BRANCHES,
        ),
        name=cfg.target,
    )
    out = Loaded(target=target, drafters=[], strict=cfg.strict, warnings=[stock] if stock else [])
    if split is not None:
        out.placement = split.summary
        # the probe's proof covers this machine's CPU; the workers' devices are measured by calibration
        verified = 0
    drafts = cfg.drafts
    if drafts and not target.can_roll_back:
        out.warnings.append(
            f"{cfg.target} keeps a recurrent state that this llama.cpp build cannot copy, so a rejected "
            "draft could only be undone by re-reading the whole context: decoding without drafts"
        )
        drafts = ()
    try:
        for spec in drafts:
            if registry.is_model_free(spec):
                # as a draft model's, its tree width is what the target makes room for (none on a
                # recurrent target, which verifies chains)
                width = min(cfg.tree_width, target.tree_branches)
                out.drafters.append(registry.make(spec, tree_width=width))
                continue
            if registry.is_target_head(spec):
                head = _target_head(target, cfg, spec, paths[head_file] if head_file is not None else None)
                out.heads.append(head)
                width = min(cfg.tree_width, target.tree_branches)
                if isinstance(head, DFlashBlock):
                    share = block_pass_share(infos[head_file], infos[cfg.target]) if head_file else 0.0
                    out.drafters.append(BlockDrafter(head, cfg.p_min, width, pass_share=share))
                else:
                    out.drafters.append(HeadDrafter(head, cfg.p_min, width))
                continue
            note(f"loading draft {paths[spec].name}")
            dm = LlamaModel(
                paths[spec],
                LoadOptions(
                    n_ctx=cfg.ctx_size,
                    gpu_layers=cfg.draft_gpu_layers if cfg.draft_gpu_layers is not None else cfg.gpu_layers,
                    threads=cfg.draft_threads or cfg.threads,
                    verbose=cfg.verbose,
                    window=cfg.draft_window,
                ),
                name=spec,
            )
            out.draft_models.append(dm)
            out.warnings.extend(check_pair(target, dm))
            width = cfg.tree_width if target.tree_branches else 0
            out.drafters.append(
                ModelDrafter(dm, p_min=cfg.p_min, tree_width=min(width, target.tree_branches))
            )
        if out.drafters:
            from ..decoding.calibration import K_MAX, exact_rows, tie_margin
            from ..llama.devices import backend_info

            note("measuring batched-vs-one-token rounding (once per model, build and machine)")
            # the build's identity keys every calibration: a rebuild (the patch queue) changes kernels
            backend = out.backend = f"{backend_info().get('system_info', '')} build:{ident['key']}"
            if split is not None:
                # a split target's passes cross the network: its verify curve (a round trip per pass,
                # so V(k)/V(1) falls) is measured through these workers and kept apart from this
                # machine's own
                backend = out.backend = f"{backend} rpc:{workers_key(workers)} {split.summary}"
            out.verified_rows = verified
            out.tie_margin = tie_margin(target, backend=backend)
            out.exact_rows = exact_rows(target, backend=backend, verified=out.verified_rows)
            if out.exact_rows >= K_MAX + 1 and out.tie_margin > 0.0:
                # exact at every width on a short context but not past 512 KV cells (batch_noise
                # measures there): trust rows only as far as a build without the proof would
                out.verified_rows = 0
                out.exact_rows = exact_rows(target, backend=backend)
    except BaseException:
        out.close()
        raise
    return out


def _target_head(
    target: LlamaModel, cfg: LoadConfig, spec: str, file: Path | None
) -> MtpHead | AssistantHead | Eagle3Head | DFlashBlock:
    """The drafter that reads the target for `--draft spec`: a block drafter for `dflash` and
    `dspark`, an EAGLE-3 head for `eagle3`; for `mtp` the target's assistant file where it has one,
    else its NextN layers (a clear error where it has neither)."""
    from ..llama.eagle3 import Eagle3Head
    from ..llama.mtp import AssistantHead, MtpHead

    kind = registry.split(spec)[0]
    if kind in registry.BLOCK_DRAFTERS and file is not None:
        return DFlashBlock(target, file, dspark=kind == registry.DSPARK, verbose=cfg.verbose)
    if registry.split(spec)[0] == registry.EAGLE3 and file is not None:
        return Eagle3Head(target, file, verbose=cfg.verbose)
    if file is not None:
        return AssistantHead(target, file, verbose=cfg.verbose)
    if target.n_nextn <= 0:
        raise BadInput(
            f"{cfg.target} has no multi-token-prediction drafter: no NextN layers in its file and no "
            "MTP assistant beside it, so `--draft mtp` has nothing to run",
            "use a GGUF that keeps them (e.g. the -MTP releases of Qwen3.6), give the assistant as "
            "--draft mtp:assistant=PATH, or another --draft",
        )
    return MtpHead(target, verbose=cfg.verbose)


def _resolve(spec: str) -> ModelRef:
    from .registry import resolve
    from .registry_toml import load_registry

    return resolve(spec, load_registry())


def fit_before_download(
    refs: Sequence[ModelRef],
    *,
    ctx_size: int,
    gpu_layers: int | None = None,
    force: bool = False,
    offline: bool | None = None,
    workers: Sequence[tuple[str, int]] = (),
) -> None:
    """Refuse, before a byte is downloaded, models that together will not fit (NotEnoughMemory),
    counting the memory `workers` (address, free bytes: --rpc) lend a split target.

    Only when something would be downloaded: files on disk get the exact check from their headers
    after `locate`. Sizes come from models.toml or the Hub's metadata (hub.download_size); without a
    header the KV cache and compute buffer are estimated from the size (hardware.estimate_from_size),
    and the message says so. When a size cannot be known (offline, Hub unreachable) nothing is
    refused here: the exact check after the download still runs.
    """
    if force or offline:
        return
    from ..errors import SpecchatError
    from . import hub
    from .cache import cached_path

    where = [ref.path if ref.path is not None else cached_path(ref) for ref in refs]
    if all(p is not None and p.is_file() for p in where):
        return  # nothing to download: `load` reads each header once, after `locate`
    models: list[hardware.ModelFootprint] = []
    for ref, on_disk in zip(refs, where, strict=True):
        if on_disk is not None and on_disk.is_file():
            try:
                info = read_gguf(on_disk, allow_truncated=True)
                models.extend(hardware.estimate_footprint([(on_disk, info)], ctx_size).models)
            except SpecchatError:  # `locate` reports a bad file with its own hint
                models.append(hardware.estimate_from_size(on_disk, on_disk.stat().st_size, ctx_size))
            continue
        size = hub.download_size(ref, offline=offline)
        if size is None:
            return
        entry = ref.entry
        models.append(
            hardware.estimate_from_size(
                ref.file or ref.display,
                size,
                ctx_size,
                params=hardware.parse_params(entry.params) if entry is not None else None,
                quant=ref.quant or (entry.quant if entry is not None and ref.file == entry.file else None),
            )
        )
    footprint = hardware.Footprint(models=tuple(models), n_ctx=ctx_size, estimated=True)
    offload, memory = _offload_and_memory(gpu_layers)
    hardware.fit_check(
        footprint, gpu_offload=offload, vram_bytes=None, force=False, memory=memory, workers=workers
    )


def _offload_and_memory(gpu_layers: int | None) -> tuple[bool, hardware.MachineMemory]:
    """Whether layers go to a GPU, and this machine's RAM and (from llama.cpp) GPU memory."""
    from ..llama.devices import device_memory

    return supports_gpu_offload() and gpu_layers != 0, hardware.machine_memory(device_memory())


def _fit_check(
    cfg: LoadConfig, paths: dict[str, Path], infos: dict[str, object], workers: Sequence[WorkerInfo] = ()
) -> None:
    """The exact check from the files' headers; a split target's workers lend their free memory."""
    fp = hardware.estimate_footprint([(paths[s], infos[s]) for s in paths], cfg.ctx_size)
    offload, memory = _offload_and_memory(cfg.gpu_layers)
    hardware.fit_check(
        fp, gpu_offload=offload, vram_bytes=None, force=cfg.force, memory=memory, workers=lent(workers)
    )


def chat_prompt(
    target: LlamaModel,
    messages: Sequence[dict[str, Any]],
    *,
    raw: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[int], str | None]:
    """Token ids for a conversation, rendered with the target's own chat template (GGUF metadata).

    Returns (tokens, warning). With raw=True, or when the model has no template, the last user
    message is used as-is (plain completion), and `template_kwargs` (the template's extra variables,
    checked already: decoding.template_vars) go unused. This is the one render every front end's
    chat goes through; a change of variables changes the tokens, so KV reuse by common prefix
    (loop.generate, the prompt cache) stays right without knowing about them.
    """
    warning = None
    template = None if raw else target.chat_template
    if template:
        facts = target.vocab_facts()
        text = _render_untrusted(
            target,
            template,
            messages,
            bos=target.token_text(facts.bos) if facts.bos >= 0 else "",
            eos=target.token_text(facts.eos) if facts.eos >= 0 else "",
            tools=tools,
            variables=template_kwargs,
        )
        tokens = target.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == facts.bos:
            tokens = tokens[1:]  # templates that write BOS themselves, plus the tokenizer's own
    else:
        if not raw:
            warning = "the target has no chat template; using the prompt as plain text (as with --raw)"
        user = [m["content"] for m in messages if m["role"] == "user"]
        text = user[-1] if user else ""
        tokens = target.tokenize(text, add_special=True, parse_special=True)
    if not tokens:
        raise BadInput("the prompt is empty", "give a prompt with -p TEXT or on stdin")
    if len(tokens) >= target.n_ctx:
        raise ContextFull(
            f"the prompt is {len(tokens)} tokens but the context window is {target.n_ctx}",
            "raise --ctx-size or shorten the prompt",
        )
    return tokens, warning


def _render_untrusted(
    target: LlamaModel,
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    bos: str,
    eos: str,
    tools: Sequence[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render a chat template taken from a GGUF file, turning any failure into one user-facing line.

    The template is untrusted code from whoever made the file. The Jinja2 sandbox stops it reaching
    Python internals (SecurityError), but the exception would otherwise surface as a traceback; and a
    template may also be broken, or refuse a conversation on purpose (`raise_exception`, e.g. "no
    system role"). None of these is a bug in specchat, so all become a SpecchatError naming the file;
    for the sandbox case the message says what happened without repeating what the template tried.
    """
    from jinja2.exceptions import SecurityError

    from ..terminal import terminal_safe

    name = target.path.name
    try:
        return render_chat(template, messages, bos=bos, eos=eos, tools=tools, variables=variables)
    except SecurityError as exc:
        raise ModelFileError(
            f"the chat template in {name} tried to reach Python internals; the sandbox refused it",
            hint="the file may be malicious: use a model from a source you trust, or --raw to skip "
            "its template",
        ) from exc
    except Exception as exc:  # untrusted code: whatever it raises is the file's problem, not ours
        detail = terminal_safe(" ".join(str(exc).split()))[:200] or type(exc).__name__
        raise ModelFileError(
            f"the chat template in {name} failed: {detail}",
            hint="--raw skips the template (the prompt is then used as plain text)",
        ) from exc
