"""Do verify batches round exactly like one-token decoding on this llama.cpp build? The batch-invariance
probe, run with the build self-check and shown by `specchat doctor`.

Why it matters: greedy speculative decoding is the target's own output only if the row of a verify
batch that decides a token holds the logits one-token decoding would have computed. Stock llama.cpp
switches CPU kernels by batch size (repacked Q4_K from 4 rows, the tiled k-quant kernel from 8, tinyBLAS
for float weights from 2, a split-KV attention for one row past 512 cells), so rows part in the last
bits and a near-tie can go the other way. specchat's patch queue (patches/llama.cpp, built by
`specchat.llama.build`) makes them agree; this probe checks that the installed build really does, for
every weight type the registry ships, so the planner trusts every verify row only where it was shown.

How: for each weight type (Q4_K repacked and not, Q6_K, Q5_K, Q8_0, F16, BF16 and the smaller Q4_0/Q5_0) a
tiny model (probe_model) decodes a token sequence one token at a time, then again in batches of n for
every n in 2..MAX_ROWS, each batch's K/V written by the batches before it, and every row must equal
the one-token row bit for bit. Attention is checked the same way over a sequence that runs past 512
KV cells, with V in bf16 (what a verifying target uses) and in f16 (where llama.cpp splits the KV),
and so are two hybrid layouts (probe_hybrid: Qwen3.5's gated delta net, LFM2's short convolutions),
whose recurrent state a batch advances several tokens at once.

The probe runs in a child process (`python -m specchat.llama.invariance probe`), like buildcheck's: a
crash in a kernel is a verdict, not a dead caller.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import child

#: verify widths checked: every n in 2..MAX_ROWS (the planner drafts at most K_MAX = 48 tokens, so a
#: verify batch holds up to 49 rows: 48 drafts and the row before them; 49 is checked too)
MAX_ROWS = 49
#: (weight type, repacked) pairs: what the registry's GGUF files use for their target matrices
CASES: tuple[tuple[str, bool], ...] = (
    ("Q4_K", True),
    ("Q4_K", False),
    ("Q6_K", True),
    ("Q5_K", True),
    ("Q8_0", True),
    ("F16", True),
    ("BF16", True),
    ("Q4_0", True),
    ("Q5_0", True),
)
#: hybrid layouts whose recurrent layers (gated delta net, short convolution) are checked like a weight type
HYBRIDS: tuple[str, ...] = ("qwen35", "lfm2")
#: tokens per matmul case (every width sees at least one full batch and a ragged last one)
SEQUENCE = 100
#: tokens of the attention case: past 512 KV cells (llama.cpp pads the KV view to 256 cells)
LONG_SEQUENCE = 640
LONG_WIDTHS = (2, 5, 16, 49)
#: token trees checked on the attention case (decoding/tree.py): a chain with side branches, the
#: engine's usual layout, and one in breadth-first order, whose siblings are interleaved so that
#: masked cells lie between a node and its ancestors. Parent of each node, root first
TREES: tuple[tuple[int, ...], ...] = (
    (-1, 0, 1, 2, 3, 4, 0, 1, 2, 7, 3),
    (-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 6, 7, 8, 10, 12),
)
#: context lengths the trees are decoded after: within the first 256-cell KV view, and past 512 cells
TREE_CONTEXTS = (97, 600)
PROBE_TIMEOUT = 300.0
GGML_TYPE_BF16 = 30


@dataclass(frozen=True)
class Invariance:
    """What the probe found. `exact_rows`: every batch of up to this many rows equals one-token
    decoding bit for bit for every case (MAX_ROWS: all of them; 1: not even 2 rows); `breaks`: the
    first case and width that parted ('' when none did); `status`: pass, fail, or could not run."""

    status: str
    exact_rows: int
    breaks: str = ""
    cases: tuple[dict[str, Any], ...] = field(default=())

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        if self.status == "pass":
            return f"verify batches: bit-exact up to {self.exact_rows} rows ({_covered(self.cases)})"
        if self.status == "fail":
            return f"verify batches: bit-exact up to {self.exact_rows} rows only: {self.breaks}"
        return f"verify batches: not checked ({self.breaks})"


def _covered(cases: Sequence[dict[str, Any]]) -> str:
    names = [str(c.get("case")) for c in cases if c.get("kind") == "matmul"]
    names += [str(c.get("case")).split(" ")[0] + " hybrid" for c in cases if c.get("kind") == "hybrid"]
    attn = [c for c in cases if c.get("kind") == "attention"]
    text = ", ".join(names)
    if attn:
        text += f"; attention to {max(int(c.get('tokens', 0)) for c in attn)} KV cells"
    if any(c.get("kind") == "tree" for c in cases):
        text += "; token trees"
    return text


def _label(qtype: str, repack: bool) -> str:
    return f"{qtype} (repacked)" if repack and qtype in ("Q4_K", "Q4_0") else qtype


def decide(cases: Sequence[dict[str, Any]]) -> Invariance:
    """The verdict from the child's cases (pure, tested directly). A case reports `first_bad` (the
    smallest width whose rows differed, 0 when none did), `row` (the first differing row) and `diff`."""
    if not cases:
        return Invariance("could not run", 0, "the probe reported no results")
    failing = sorted((c for c in cases if int(c.get("first_bad", 0)) > 0), key=_parts_at)
    if not failing:
        return Invariance("pass", min(int(c.get("max_width", MAX_ROWS)) for c in cases), "", tuple(cases))
    n = _parts_at(failing[0])
    parts = []
    for c in failing:
        text = f"{c.get('case')} from {c['first_bad']} rows"
        if c.get("kind") == "attention":
            text += f" (row {c.get('row')} of {c.get('tokens')})"
        if c.get("kind") == "tree":
            text = f"{c.get('case')}: node {c.get('row')} of a {c['first_bad']}-node tree"
        parts.append(text)
    where = "parts from one-token decoding: " + ", ".join(parts)
    where += f" (max |d logit| {max(float(c.get('diff', 0.0)) for c in failing):.3g})"
    return Invariance("fail", n - 1, where, tuple(cases))


def _parts_at(case: dict[str, Any]) -> int:
    """The batch width from which a failing case shows rows parting. A token tree that parts says
    nothing about which chain widths are safe (its rows differ in their attention masks, not in
    their count), so it counts as parting from 2 rows: the build is not shown exact at all."""
    return 2 if case.get("kind") == "tree" else int(case["first_bad"])


def _compare(model: Any, tokens: Sequence[int], widths: Sequence[int]) -> tuple[int, int, float]:
    """(first width whose batches part from one-token decoding or 0, its first differing row, max diff)."""
    import numpy as np

    model.truncate(0)
    ref = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in tokens])
    for n in widths:
        model.truncate(0)
        rows = []
        for i in range(0, len(tokens), n):
            chunk = list(tokens[i : i + n])
            rows.extend(np.array(model.decode(chunk, list(range(len(chunk)))), copy=True))
        got = np.stack(rows)
        differ = np.nonzero(np.any(got != ref, axis=1))[0]
        if len(differ):
            return n, int(differ[0]), float(np.abs(got - ref).max())
    return 0, -1, 0.0


def _compare_tree(model: Any, tokens: Sequence[int], contexts: Sequence[int]) -> tuple[int, int, float]:
    """Like _compare for token trees: after each context (written one token at a time), every row
    of each TREES batch against one-token decoding of its node's path. (rows of the first tree
    batch that parted or 0, its first differing node, max diff)."""
    import numpy as np

    from ..decoding.tree import TreeShape

    for n_ctx in contexts:
        model.truncate(0)
        for t in tokens[:n_ctx]:
            model.decode([t], [])
        for parents in TREES:
            shape = TreeShape(parents)
            nodes = [int(t) for t in tokens[n_ctx : n_ctx + len(parents)]]
            ref = []
            for node in range(len(shape)):
                model.truncate(n_ctx)
                for j in shape.path_to(node):
                    row = model.decode([nodes[j]], [0])[0]
                ref.append(np.array(row, copy=True))
            model.truncate(n_ctx)
            got = np.array(model.decode_tree(nodes, shape, range(len(shape))), copy=True)
            model.keep_path(shape, [0])
            differ = np.nonzero(np.any(got != np.stack(ref), axis=1))[0]
            if len(differ):
                return len(shape), int(differ[0]), float(np.abs(got - np.stack(ref)).max())
    return 0, -1, 0.0


def _step(text: str) -> None:
    print(f"step {text}", flush=True)


def probe_cases(
    *,
    cases: Sequence[tuple[str, bool]] = CASES,
    widths: Sequence[int] = tuple(range(2, MAX_ROWS + 1)),
    long_widths: Sequence[int] = LONG_WIDTHS,
    hybrids: Sequence[str] = HYBRIDS,
    trees: bool = True,
    say: Callable[[str], None] = _step,
) -> list[dict[str, Any]]:
    """Evaluate the probe models on the installed build in this process (the child calls it; tests
    call it with fewer widths), one case dict per weight type and per V type of the attention case."""
    import numpy as np

    from ..decoding.settings import TREE_BRANCHES
    from .engine import LlamaModel, LoadOptions
    from .probe_hybrid import write_probe_hybrid
    from .probe_model import write_probe_gguf

    rng = np.random.default_rng(11)
    found: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="specchat-invariance-") as tmp:
        for qtype, repack in cases:
            label = _label(qtype, repack) if repack else f"{qtype} (not repacked)"
            say(f"{label}, batches of {min(widths)}..{max(widths)} rows")
            path = write_probe_gguf(Path(tmp) / f"inv-{qtype}.gguf", qtype, seed=2, n_ctx=256)
            opts = LoadOptions(n_ctx=256, gpu_layers=0, repack=repack, type_v=GGML_TYPE_BF16)
            tokens = [int(t) for t in rng.integers(3, 259, SEQUENCE)]
            with LlamaModel(path, opts) as model:
                bad, row, diff = _compare(model, tokens, widths)
            found.append({"kind": "matmul", "case": label, "first_bad": bad, "row": row, "diff": diff,
                          "max_width": max(widths)})  # fmt: skip
        for arch in hybrids:
            say(f"hybrid {arch} (recurrent layers), batches of {min(widths)}..{max(widths)} rows")
            path = write_probe_hybrid(Path(tmp) / f"inv-{arch}.gguf", arch, seed=4, n_ctx=256)
            opts = LoadOptions(n_ctx=256, gpu_layers=0, repack=True, type_v=GGML_TYPE_BF16)
            tokens = [int(t) for t in rng.integers(3, 259, SEQUENCE)]
            with LlamaModel(path, opts) as model:
                bad, row, diff = _compare(model, tokens, widths)
            found.append({"kind": "hybrid", "case": f"{arch} (recurrent)", "first_bad": bad, "row": row,
                          "diff": diff, "max_width": max(widths)})  # fmt: skip
        n_ctx = LONG_SEQUENCE + 128
        path = write_probe_gguf(Path(tmp) / "inv-attn.gguf", "Q8_0", seed=3, n_ctx=n_ctx)
        tokens = [int(t) for t in rng.integers(3, 259, LONG_SEQUENCE)]
        for type_v, name in ((GGML_TYPE_BF16, "bf16"), (None, "f16")):
            say(f"attention past 512 KV cells, V {name}")
            # a target's context: room for token trees' branches in one unified cache
            opts = LoadOptions(
                n_ctx=n_ctx, gpu_layers=0, repack=True, type_v=type_v, tree_branches=TREE_BRANCHES
            )
            with LlamaModel(path, opts) as model:
                bad, row, diff = _compare(model, tokens, long_widths)
                found.append({"kind": "attention", "case": f"attention (V {name})", "first_bad": bad,
                              "row": row, "diff": diff, "tokens": LONG_SEQUENCE, "type_v": name,
                              "max_width": max(long_widths)})  # fmt: skip
                if trees:
                    say(f"token trees after {', '.join(map(str, TREE_CONTEXTS))} KV cells, V {name}")
                    bad, row, diff = _compare_tree(model, tokens, TREE_CONTEXTS)
                    found.append({"kind": "tree", "case": f"token trees (V {name})", "first_bad": bad,
                                  "row": row, "diff": diff, "tokens": max(TREE_CONTEXTS), "type_v": name,
                                  "max_width": max(long_widths)})  # fmt: skip
    return found


def _probe_main() -> int:
    """The child: `step ...` lines as it goes, then one JSON object with the cases."""
    print(json.dumps({"cases": probe_cases()}), flush=True)
    return 0


def run_probe(*, timeout: float = PROBE_TIMEOUT) -> Invariance:
    """Probe the installed build in a child process."""
    argv = [sys.executable, "-m", "specchat.llama.invariance", "probe"]

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Invariance("could not run", 0, f"the probe did not finish within {timeout:.0f} s")
    return from_output(done.returncode, done.stdout, done.stderr)


def from_output(returncode: int, stdout: str, stderr: str) -> Invariance:
    """The verdict from what the child did (pure): a crash or a missing report is `could not run`."""
    payload = child.report(stdout)
    if returncode != 0 or payload is None:
        tail = " ".join(stderr.strip().splitlines()[-1:])[-160:] or f"exit status {returncode}"
        return Invariance("could not run", 0, f"the probe failed{child.last_step(stdout)}: {tail}")
    return decide([c for c in payload.get("cases", []) if isinstance(c, dict)])


def to_row(result: Invariance) -> dict[str, Any]:
    return asdict(result)


def from_row(row: Any) -> Invariance | None:
    if not isinstance(row, dict):
        return None
    try:
        return Invariance(
            status=str(row["status"]),
            exact_rows=int(row["exact_rows"]),
            breaks=str(row.get("breaks", "")),
            cases=tuple(c for c in row.get("cases", ()) if isinstance(c, dict)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specchat.llama.invariance probe` (the child; `python -m specchat.llama.buildcheck
    check` runs it after the self-check and shows both verdicts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["probe"]:
        return _probe_main()
    print(
        "usage: python -m specchat.llama.invariance probe (run by: python -m specchat.llama.buildcheck check)"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
