"""specchat's own cost calibration of a target and draft pair, written as a cost-curve file.

Loads the pair with specchat's own loader (specchat/models/loader.py: the target with repacked
weights, all layers offloaded when the build can, its tie margin and bit-exact batch size) and takes
what the planner plans with from planner.make_planner (specchat/decoding/calibration.py): the verify
curve V(1..K_MAX+1) and the draft model's cost per drafted token and per caught-up token. `curve_doc` turns
that into the format of tests/perf/curves/*.json, which replay_curves.from_file reads.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specchat.decoding.calibration import VERIFY_SIZES  # noqa: E402


@dataclass(slots=True)
class Measured:
    """What calibration measured (seconds), and on what."""

    verify: list[float]  # V(1..K_MAX+1)
    draft: float  # the draft model's seconds per drafted token
    catch_up: float  # ... per token of catching up (a 16-token batch)
    exact_n: int
    tie_margin: float
    gpu_layers: int
    system_info: str
    devices: list[str]
    llama_cpp_python: str
    seconds: dict[str, float] = field(default_factory=dict)  # load / calibration wall times
    notes: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.gpu_layers != 0


def measure_pair(
    target: Path,
    draft: Path,
    *,
    gpu_layers: int | None = None,
    n_ctx: int | None = None,
    threads: int | None = None,
    say: Callable[[str], None] = print,
) -> Measured:
    """Load both models with the loader (`specchat run TARGET --draft DRAFT --draft ngram`) and take
    the costs the planner plans with (planner.make_planner's calibration). The cache in store.home()
    is used: point SPECCHAT_HOME at an empty folder for a fresh measurement."""
    from specchat.decoding.planner import make_planner
    from specchat.decoding.settings import CTX_SIZE
    from specchat.llama.devices import backend_info, device_memory
    from specchat.models.loader import LoadConfig, load

    n_ctx = n_ctx or CTX_SIZE
    info = backend_info()
    seconds: dict[str, float] = {}
    cfg = LoadConfig(str(target), (str(draft), "ngram"), ctx_size=n_ctx, gpu_layers=gpu_layers,
                     threads=threads, offline=True)  # fmt: skip
    t = time.perf_counter()
    loaded = load(cfg)  # with the tie margin and bit-exact batch size, as every run measures them
    try:
        seconds["load, tie margin and exact rows"] = time.perf_counter() - t
        tm = loaded.target
        say(
            f"loaded {target.name} and {draft.name}: GPU layers {tm.gpu_layers} and "
            f"{loaded.draft_models[0].gpu_layers} (-1: all), {tm.threads} threads, context {n_ctx}"
        )
        t = time.perf_counter()
        costs = make_planner(loaded, None).costs
        seconds["calibrate"] = time.perf_counter() - t
        exact_n, margin, gpu_layers_used = loaded.exact_rows, loaded.tie_margin, tm.gpu_layers
    finally:
        loaded.close()
    devices = [
        f"{d.kind} {d.description or d.name} ({d.total_bytes / 2**30:.0f} GiB)" for d in device_memory()
    ]
    return Measured(
        verify=list(costs.verify),
        draft=float(costs.draft[0]),
        catch_up=float(costs.catch_up[0]),
        exact_n=int(exact_n),
        tie_margin=float(margin),
        gpu_layers=int(gpu_layers_used),
        system_info=str(info.get("system_info", "")),
        devices=devices,
        llama_cpp_python=str(info.get("llama_cpp_python", "")),
        seconds=seconds,
        notes=list(costs.notes),
    )


def curve_table(m: Measured) -> str:
    """The measured curve as text: V(n) at calibration's measured sizes, then the draft's costs."""
    v1 = m.verify[0]
    lines = ["   n   V(n) ms   V(n)/V(1)   ms a token"]
    for n in VERIFY_SIZES:
        if n <= len(m.verify):
            v = m.verify[n - 1]
            lines.append(f"{n:4d} {v * 1e3:9.3f} {v / v1:11.3f} {v * 1e3 / n:12.3f}")
    lines.append(
        f"draft: {m.draft * 1e3:.3f} ms a drafted token ({m.draft / v1:.3f} of V(1)); catching up "
        f"{m.catch_up * 1e3:.3f} ms a token ({m.catch_up / m.draft:.3f} of a drafted one)"
    )
    lines.append(f"bit-exact verify batch: up to {m.exact_n} row(s); tie margin {m.tie_margin:.4g}")
    return "\n".join(lines)


def sig(x: float, digits: int = 6) -> float:
    """x to `digits` significant digits (a curve file's seconds: a GPU's are milliseconds)."""
    return float(f"{x:.{digits}g}")


def dump_curve(doc: dict[str, object]) -> str:
    """JSON with one level of indentation and every list of numbers on one line."""

    def one_line(m: re.Match[str]) -> str:
        return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"

    return re.sub(r"\[\s+([-0-9.e+,\s]+?)\s+\]", one_line, json.dumps(doc, indent=1)) + "\n"


def curve_doc(
    m: Measured, *, name: str, hardware: str, target: str, draft: str, sources: list[str], notes: str = ""
) -> dict[str, object]:
    """A tests/perf/curves/*.json document of the measured curve (replay_curves.from_file reads it):
    V(n)/V(1) at calibration's measured sizes (between them it interpolates linearly, as calibration
    does), the draft's cost as draft_ratio, and what calibration measured beyond the published files
    (catch_up_ratio, tie_margin, exact_n: the replay uses them for this curve)."""
    v1 = m.verify[0]
    sizes = [n for n in VERIFY_SIZES if n <= len(m.verify)]
    return {
        "name": name,
        "hardware": hardware,
        "target": target,
        "draft": draft,
        "relative": {str(n): sig(m.verify[n - 1] / v1) for n in sizes},
        "v1_seconds": sig(v1),
        "draft_ratio": [sig(m.draft / v1)],
        "catch_up_ratio": sig(m.catch_up / m.draft),
        "tie_margin": m.tie_margin,
        "exact_n": m.exact_n,
        "sources": sources,
        "notes": notes
        or (
            "Measured by specchat's calibration (calibrate, tie_margin, exact_rows, as `specchat run` "
            "calls them) on random weights: decode cost depends on the shapes and the weight type, not on "
            "the values; the tie margin does depend on them (random logits of std ~3 here). Sizes "
            f"between {', '.join(map(str, sizes))} interpolated linearly, as calibration does."
        ),
        "measured": {
            "verify_seconds": [sig(x) for x in m.verify],
            "draft_seconds": sig(m.draft),
            "catch_up_seconds": sig(m.catch_up),
            "gpu_layers": m.gpu_layers,
            "devices": m.devices,
            "llama_cpp_python": m.llama_cpp_python,
            "system_info": m.system_info,
            "machine": f"{platform.machine()} {platform.processor()}".strip(),
            "wall_seconds": {k: round(v, 2) for k, v in m.seconds.items()},
            "calibration_notes": m.notes,
        },
    }
