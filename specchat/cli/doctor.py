"""`specchat doctor`: everything a bug report needs about this machine and this installation.

Why a command: "it is slow" or "it will not load" depends on the llama.cpp build (GPU offload or CPU
only, which SIMD instructions), the cores and free RAM, where models are cached and what is there,
whether the Hub can be reached, and library versions. One command prints all of it, as a Rich report
for people or `--json` for machines.

Design rules:
- Every section is collected on its own and a failure becomes that section's `error`, never an abort:
  doctor is what users run when something is broken (a bad models.toml, a llama.cpp build that will
  not import), so it must keep going.
- It never downloads and never waits long: the Hub probe has a short timeout and is skipped when
  offline (`--offline` or HF_HUB_OFFLINE=1).
- Strings that come from files or the environment (GGUF metadata, paths, error texts) are untrusted:
  on the terminal they are shown with control characters made visible and Rich markup escaped.

This module collects; `doctor_report.py` draws the collected report as tables.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from specchat.cli.common import guarded
from specchat.cli.doctor_report import render_report

#: Seconds the Hub probe may take: long enough for a real endpoint, short enough not to stall doctor.
HUB_TIMEOUT = 2.0
#: Width of the report when it goes to a file or pipe (Rich would use 80 and fold every path).
REPORT_WIDTH = 160
#: Directory entries visited per cache before the size is reported as a lower bound (HF_HOME can hold
#: dataset caches with millions of files; doctor must stay quick).
WALK_LIMIT = 200_000

#: Distributions whose versions matter in bug reports (install name -> shown name).
LIBRARIES: dict[str, str] = {
    "specchat": "specchat",
    "llama-cpp-python": "llama-cpp-python",
    "huggingface-hub": "huggingface_hub",
    "typer": "typer",
    "rich": "rich",
    "numpy": "numpy",
    "jinja2": "jinja2",
    "psutil": "psutil",
}

#: llama.cpp backends that offload layers to an accelerator, with the names users know them by.
GPU_BACKENDS: dict[str, str] = {
    "METAL": "Metal",
    "CUDA": "CUDA",
    "HIP": "ROCm/HIP",
    "ROCM": "ROCm/HIP",
    "VULKAN": "Vulkan",
    "SYCL": "SYCL",
    "OPENCL": "OpenCL",
    "MUSA": "MUSA",
    "CANN": "CANN",
    "KOMPUTE": "Kompute",
}

#: CPU "features" in llama.cpp's system info that are build options, not instruction-set extensions.
NOT_SIMD = frozenset({"LLAMAFILE", "OPENMP", "REPACK", "ACCELERATE", "KLEIDIAI", "BLAS", "AARCH64_REPACK"})

_BACKEND_RE = re.compile(r"^\s*(?P<backend>[A-Za-z][A-Za-z0-9_ .-]*?)\s*:\s*(?P<rest>.*)$")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Do not probe the Hub (also when HF_HUB_OFFLINE=1).")
]


def register(app: typer.Typer) -> None:
    """Add `doctor` to the main app; `guarded` keeps even unexpected user errors to one line."""
    app.command("doctor")(guarded(doctor_command))


WorkersOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="Also ask these llama.cpp RPC workers (`specchat worker`) what they serve: protocol version, "
        "devices, free and total memory, or why they cannot be used.",
    ),
]


def doctor_command(as_json: JsonOpt = False, offline: OfflineOpt = False, rpc: WorkersOpt = None) -> None:
    """Show the llama.cpp build, cores, RAM, caches, cached models, Hub access and versions.

    Paste its output into bug reports. `--json` gives the same facts for scripts. With --rpc, the
    workers a split target would use are asked too (one line each, a failure included).
    """
    endpoints = _endpoints(rpc) if rpc is not None else ()  # a malformed list: one line, before anything
    report = collect(probe_hub=not offline)
    if rpc is not None:
        report["workers"] = worker_facts(endpoints)
    if as_json:
        # ensure_ascii: metadata strings come from files; \\u escapes keep control characters inert
        typer.echo(json.dumps(report, indent=2, ensure_ascii=True, default=str))
        return
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = REPORT_WIDTH  # a file or a pipe (a bug report): keep paths on one line
    console.print(render_report(report))


# --------------------------------------------------------------------------------------------------------
# Collecting


def collect(*, probe_hub: bool = True, hub_timeout: float = HUB_TIMEOUT) -> dict[str, Any]:
    """All facts as plain JSON-serialisable data; a section that fails carries {"error": "..."}."""
    return {
        "specchat": _section(_specchat_facts),
        "llama_cpp": _section(llama_cpp_facts),
        "build_check": _section(build_check_facts),
        "system": _section(_system_facts),
        "caches": _section(cache_facts),
        "models": _section(cached_models),
        "hub": _section(lambda: hub_facts(probe=probe_hub, timeout=hub_timeout)),
        "versions": library_versions(),
    }


def _section(fn: Callable[[], Any]) -> Any:
    """Run one collector; turn its failure into data so the other sections are still reported."""
    try:
        return fn()
    except Exception as exc:  # doctor reports problems, it does not stop at them
        return {"error": _error_text(exc)}


def _error_text(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _specchat_facts() -> dict[str, Any]:
    from specchat import __version__

    return {
        "version": __version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "package_dir": str(Path(__file__).resolve().parents[1]),
    }


def _system_facts() -> dict[str, Any]:
    from specchat.models.hardware import system_facts

    return system_facts()


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """llama.cpp's `llama_print_system_info()` as {backend: {feature: value}}.

    The format is `CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | ... |`: a
    "NAME :" prefix starts a backend, items are "KEY = VALUE". Older builds print no backend names;
    their items count as CPU features.
    """
    backends: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for raw in text.split("|"):
        item = raw.strip()
        if not item:
            continue
        match = _BACKEND_RE.match(item)
        if match and "=" not in match.group("backend"):
            current = backends.setdefault(match.group("backend").strip(), {})
            item = match.group("rest").strip()
            if not item:
                continue
        if current is None:
            current = backends.setdefault("CPU", {})
        key, _, value = item.partition("=")
        current[key.strip()] = value.strip()
    return backends


def llama_cpp_facts() -> dict[str, Any]:
    """The llama.cpp build: can it offload to a GPU (which), which SIMD paths the CPU backend has."""
    from specchat.llama import devices

    info = devices.backend_info()
    system_info = str(info.get("system_info", ""))
    backends = parse_system_info(system_info)
    cpu = next((feats for name, feats in backends.items() if name.upper() == "CPU"), {})
    simd = [k for k, v in cpu.items() if v == "1" and k.upper() not in NOT_SIMD]
    flags = [f"{k}={v}" if v not in ("", "1") else k for k, v in cpu.items() if k not in simd and v != "0"]
    gpus = [GPU_BACKENDS[name.upper()] for name in backends if name.upper() in GPU_BACKENDS]
    offload = bool(info.get("gpu_offload"))
    if offload:
        label = ", ".join(dict.fromkeys(gpus)) or "yes (backend not named by llama.cpp)"
    elif gpus:
        # a CUDA/Metal/... build whose backend registered no device: no driver, no GPU, or a driver
        # older than the build's runtime (llama.cpp says which on stderr at load); it runs on the CPU
        names = ", ".join(dict.fromkeys(gpus))
        label = f"none: this {names} build found no usable device (check the driver); CPU only"
    else:
        label = "CPU only"
    return {
        "llama_cpp_python": info.get("llama_cpp_python"),
        "gpu_offload": offload,
        "gpu_backend": label,
        "backends": list(backends),
        "cpu_simd": simd,
        "cpu_build_flags": flags,
        "mmap": info.get("mmap"),
        # llama.cpp's RPC backend, for `specchat worker` and `--rpc` (make install builds it in)
        "rpc": _has_rpc(),
        "system_info": system_info,
        # what the fit check plans with: each device and its memory, as llama.cpp reports it
        "devices": [
            {
                "name": d.name,
                "description": d.description,
                "kind": d.kind,
                "free_bytes": d.free_bytes,
                "total_bytes": d.total_bytes,
            }
            for d in devices.device_memory()
        ],
    }


def _endpoints(text: str) -> tuple[Any, ...]:
    from specchat.llama.rpc_wire import parse_endpoints

    return parse_endpoints(text)


def worker_facts(endpoints: Iterable[Any]) -> list[dict[str, Any]]:
    """Each RPC worker's answer to the probe `--rpc` runs before a load (standard library only: no
    llama.cpp), or the one line saying why it cannot be used."""
    from specchat.errors import WorkerError
    from specchat.llama.rpc_wire import probe

    tag = _build_tag()
    out: list[dict[str, Any]] = []
    for endpoint in endpoints:
        try:
            info = probe(endpoint, build_tag=tag)
        except WorkerError as exc:
            out.append({"endpoint": str(endpoint), "error": exc.message, "hint": exc.hint})
            continue
        out.append(
            {
                "endpoint": str(endpoint),
                "rpc_version": ".".join(map(str, info.version)),
                "devices": [{"free_bytes": free, "total_bytes": total} for free, total in info.memory],
                "free_bytes": info.free_bytes,
                "total_bytes": info.total_bytes,
            }
        )
    return out


def _build_tag() -> int | None:
    try:
        from specchat.llama.rpc import build_tag

        return build_tag()
    except Exception:  # a llama.cpp that will not load: the workers are still asked
        return None


def _has_rpc() -> bool:
    from specchat.llama.rpc import rpc_supported

    return rpc_supported()


def build_check_facts() -> dict[str, Any]:
    """Which llama-cpp-python build is installed (specchat's patched one or a stock one) and the stored
    verdict of `make install`'s llama.cpp self-check for it (never runs the probe: that takes seconds
    and, on a bad build, a crashing child process)."""
    from specchat.llama import buildcheck

    ident = buildcheck.build_identity()
    result = buildcheck.stored_result(ident)
    out: dict[str, Any] = {"name": buildcheck.CHECK_NAME, "build_key": ident["key"]}
    installed = buildcheck.installed_build(ident)
    out["build"] = installed_build_facts(installed)
    out["exactness"] = exactness_facts(result, installed.queue)
    if result is None:
        out.update(
            status="not checked",
            detail="this build was not checked yet: run `python -m specchat.llama.buildcheck check` "
            "(`make install` does)",
            checked_at=None,
            buffers=[],
        )
        return out
    out.update(
        status=result.status,
        detail=result.detail,
        checked_at=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.checked_at)),
        buffers=list(result.buffers),
    )
    if result.bad:
        out["fix"] = f"run `make install`, or: {buildcheck.fix_command(result.version)}"
    return out


def installed_build_facts(installed: Any) -> dict[str, Any]:
    """Which llama-cpp-python build is installed (`llama.installed.Installed`): "patched", "patched,
    another queue", "stock" or "not installed", its version and queue, the line the report shows, and
    -- for any but this checkout's patched build -- what to do (what every load's warning says)."""
    out: dict[str, Any] = {
        "kind": installed.kind,
        "version": installed.version,
        "queue": installed.queue,
        "line": installed.line(),
    }
    advice = installed.advice()
    if advice is not None:
        out["fix"] = advice
    return out


def exactness_facts(result: Any, queue: str | None) -> dict[str, Any]:
    """Whether verify batches round like one-token decoding on this build (the invariance probe's
    stored verdict), which build it is, and -- where they do not -- why and what to do."""
    build_kind = f"patched (specchat queue {queue})" if queue else "stock llama-cpp-python (no patch queue)"
    verdict = result.exactness if result is not None else None
    out: dict[str, Any] = {"build": build_kind}
    if verdict is None:
        out.update(status="not checked", exact_rows=0, line="verify batches: not checked on this build")
        out["why"] = "run `python -m specchat.llama.buildcheck check` (`make install` does)"
        return out
    out.update(status=verdict.status, exact_rows=verdict.exact_rows, line=verdict.line())
    if not verdict.passed:
        out["why"] = (
            "greedy output is kept equal to --no-draft's with a tie margin (and --strict re-checks); "
            + (
                "`make install` builds the patched llama.cpp whose batches are bit-exact"
                if not queue
                else "the patched kernels did not hold on this CPU: please report `specchat doctor --json`"
            )
        )
    return out


def dir_usage(path: Path, *, limit: int = WALK_LIMIT) -> dict[str, Any]:
    """Bytes and number of regular files under `path`, without following links.

    Links are skipped because the HF cache's snapshots are links into its blobs: each file counts
    once. After `limit` entries the walk stops and `complete` is false (the size is then a minimum).
    """
    total = files = seen = 0
    complete = True
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > limit:
                complete = False
                stack.clear()
                break
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
                    files += 1
            except OSError:
                continue
    return {"size_bytes": total, "files": files, "complete": complete}


def cache_facts() -> dict[str, Any]:
    """Each cache location specchat uses (see cache.cache_dirs), whether it exists and what it holds."""
    from specchat.models.cache import cache_dirs

    out: dict[str, Any] = {}
    for key, path in cache_dirs().items():
        row: dict[str, Any] = {"path": str(path), "exists": path.is_dir()}
        if row["exists"]:
            row.update(dir_usage(path))
        out[key] = row
    return out


def _cached_gguf_files() -> list[Path]:
    """GGUF files in the HF hub cache (snapshot links) and in specchat's mirror cache."""
    from specchat.models.cache import cache_dirs

    dirs = cache_dirs()
    found: list[Path] = []
    hub_cache = dirs["hf_hub_cache"]
    if hub_cache.is_dir():
        for repo_dir in sorted(hub_cache.glob("models--*")):
            found.extend(sorted((repo_dir / "snapshots").rglob("*.gguf")))
    mirror = dirs["mirror_models"]
    if mirror.is_dir():
        found.extend(sorted(mirror.rglob("*.gguf")))
    return found


def cached_models() -> dict[str, Any]:
    """Models on disk: registry aliases first (alias, path, size), then any other GGUF in the caches.

    Each file's header is read (not its weights) for its name, architecture and quantisation, and to
    flag a truncated download. A broken models.toml is reported, not fatal.
    """
    from specchat.errors import SpecchatError
    from specchat.models.cache import cached_path
    from specchat.models.registry import resolve
    from specchat.models.registry_toml import load_registry

    alias_of: dict[str, str] = {}
    registry_path: str | None = None
    registry_error: str | None = None
    n_models = 0
    try:
        registry = load_registry()
        registry_path = str(registry.path)
        n_models = len(registry.models)
        for alias in registry.models:
            path = cached_path(resolve(alias, registry))
            if path is not None:
                alias_of.setdefault(str(path), alias)
    except SpecchatError as exc:
        registry_error = exc.message
    paths = list(dict.fromkeys([*alias_of, *(str(p) for p in _cached_gguf_files())]))
    rows = [_model_row(Path(p), alias_of.get(p)) for p in paths]
    rows.sort(key=lambda r: (r["alias"] is None, r["alias"] or "", r["path"]))
    return {
        "registry": registry_path,
        "registry_models": n_models,
        "registry_error": registry_error,
        "cached": rows,
    }


def _model_row(path: Path, alias: str | None) -> dict[str, Any]:
    from specchat.errors import SpecchatError
    from specchat.models.gguf import read_gguf

    row: dict[str, Any] = {
        "alias": alias,
        "path": str(path),
        "size_bytes": None,
        "name": None,
        "architecture": None,
        "quant": None,
        "truncated": None,
        "error": None,
    }
    try:
        row["size_bytes"] = path.stat().st_size
    except OSError as exc:
        row["error"] = f"cannot stat the file ({exc.strerror or exc}); a broken cache link?"
        return row
    try:
        info = read_gguf(path, allow_truncated=True)
    except SpecchatError as exc:
        row["error"] = exc.message
        return row
    row.update(
        name=info.name,
        architecture=info.architecture or None,
        quant=info.file_type,
        truncated=info.is_truncated,
    )
    return row


def hub_facts(*, probe: bool = True, timeout: float = HUB_TIMEOUT) -> dict[str, Any]:
    """The Hub endpoint and whether it answers; offline settings are respected (no probe at all)."""
    from specchat.models import hub
    from specchat.models.cache import hf_endpoint, is_offline

    out: dict[str, Any] = {
        "endpoint": hf_endpoint(),
        "offline": is_offline(),
        "checked": False,
        "reachable": None,
        "seconds": None,
    }
    if out["offline"]:
        out["note"] = "not checked: offline (HF_HUB_OFFLINE)"
    elif not probe:
        out["note"] = "not checked (--offline)"
    else:
        t0 = time.perf_counter()
        out["reachable"] = hub.hub_reachable(timeout=timeout)
        out["seconds"] = round(time.perf_counter() - t0, 3)
        out["checked"] = True
    return out


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str | None]:
    """Installed versions from package metadata (nothing is imported); None when not installed."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in names:
        try:
            out[LIBRARIES.get(dist, dist)] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[LIBRARIES.get(dist, dist)] = None
    return out
