"""Benchmark-size GGUFs of today's layouts with random weights and a planted pattern (tests/planted_gguf.py):
a Qwen3.5-layout target with a qwen2 draft, a larger Qwen3.5-layout target carrying one NextN (MTP)
block, an LFM2 target with a smaller LFM2 draft, and a Gemma 4 target with its MTP assistant.

Each pair shares the planted rule, so drafts are partly accepted while the text stays varied: prompt
lookup finds little of it. The `noise` of each preset was set by measuring: --check for how often each
model follows the rule, llama-server's acceptance at --spec-draft-n-max 4 (tests/perf/hybrid_serve.py)
for the pairs, aiming at 40-70% of drafted tokens accepted for a draft model and 30-60% for an MTP head.

The tokenizer defaults to that of a real GGUF (--tokenizer-from, default the Qwen2.5-Coder 1.5B in the
dev model cache, 151,936 tokens): real prompts then tokenize as they do for real models, the output
layer costs what a real vocabulary costs, and the rule runs over ~150k ordinary tokens. The synthetic
vocabulary (--synthetic-vocab N) has only ~500 ordinary tokens whatever N is (the rest are unused
padding, never emitted, which still cost their share of the output layer): the rule then runs over
those ~500 only, and English prompts come out 2.1-3x as many tokens (tests/perf/bench_prompts.jsonl).

Usage:
  python tests/perf/hybrid_models.py [OUT_DIR] [--only NAME ...] [--check]
     [--tokenizer-from GGUF | --synthetic-vocab N]
OUT_DIR defaults to ~/.cache/specchat-dev/hybrid (7 files, 6.2 GiB in all; the 1.6 GiB Qwen3.5 16x2048
file takes 45-55 s and at most 2.7 GiB of memory to write on a 2-core VM). --check loads each pair in
specchat's engine (and each MTP drafter through llama.cpp's MTP context) and prints how often target,
draft and MTP head follow the rule, how often the drafter's first proposal is the target's token, and
prompt lookup's share.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.gemma4_models import AssistantShape, Gemma4Shape, write_gemma4, write_gemma4_assistant  # noqa: E402
from tests.hybrid_models import Lfm2Shape, Qwen2Shape, Qwen35Shape, write_lfm2, write_qwen2, write_qwen35  # noqa: E402
from tests.planted_gguf import Family, Vocab  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "specchat-dev" / "hybrid"
DEFAULT_TOKENIZER = (
    Path.home() / ".cache" / "specchat-dev" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
)


@dataclass(frozen=True)
class Preset:
    """One file: which writer, with what arguments; `drafts` names the files that draft for it
    (`mtp`: its drafter is an MTP head: its own NextN block, or a Gemma 4 assistant file)."""

    writer: Callable[..., Path]
    kwargs: dict[str, Any]
    label: str
    drafts: tuple[str, ...] = ()
    mtp: str | None = None
    role: str = "target"
    extra: dict[str, Any] = field(default_factory=dict)


QWEN35_SMALL = Qwen35Shape(
    n_embd=1024,
    n_layer=12,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    n_ff=3584,
    lin_k_heads=16,
    lin_v_heads=16,
    lin_head_dim=128,
)
QWEN35_LARGE = Qwen35Shape(
    n_embd=2048,
    n_layer=16,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    n_ff=6144,
    lin_k_heads=16,
    lin_v_heads=16,
    lin_head_dim=128,
    nextn=1,
)
GEMMA4 = Gemma4Shape(
    n_embd=1024,
    n_layer=12,
    swa_period=6,
    n_head=8,
    n_head_kv_swa=4,
    n_head_kv_full=2,
    head_dim_swa=128,
    head_dim_full=256,
    n_ff=4096,
    sliding_window=512,
)

PRESETS: dict[str, Preset] = {
    "qwen35-12x1024-f16": Preset(
        write_qwen35,
        {"shape": QWEN35_SMALL, "qtype": "f16", "noise": 2.1},
        "Qwen3.5 layout (0.8B shapes, 12 layers), F16",
        drafts=("qwen2-2x512-f16",),
    ),
    "qwen2-2x512-f16": Preset(
        write_qwen2,
        {
            "shape": Qwen2Shape(n_embd=512, n_layer=2, n_head=8, n_head_kv=2, n_ff=1536),
            "qtype": "f16",
            "noise": 3.05,
            "seed": 2,
        },
        "qwen2 draft, 2 layers x 512, F16",
        role="draft",
    ),
    "qwen35-16x2048-q8_0-mtp": Preset(
        write_qwen35,
        {"shape": QWEN35_LARGE, "qtype": "q8_0", "noise": 2.3, "mtp_noise": 14.0},
        "Qwen3.5 layout (2B shapes, 16 layers) with one NextN block, Q8_0",
        mtp="self",
    ),
    "lfm2-16x2048-q8_0": Preset(
        write_lfm2,
        {
            "shape": Lfm2Shape(
                n_embd=2048, n_layer=16, attn_layers=(2, 5, 8, 10, 12, 14), n_head=32, n_head_kv=8, n_ff=8192
            ),
            "qtype": "q8_0",
            "noise": 1.45,
        },
        "LFM2 layout (1.2B shapes), Q8_0",
        drafts=("lfm2-16x1024-q8_0",),
    ),
    "lfm2-16x1024-q8_0": Preset(
        write_lfm2,
        {
            "shape": Lfm2Shape(
                n_embd=1024, n_layer=16, attn_layers=(2, 5, 8, 10, 12, 14), n_head=16, n_head_kv=8, n_ff=4608
            ),
            "qtype": "q8_0",
            "noise": 1.0,
            "seed": 7,
        },
        "LFM2 draft (350M shapes), Q8_0",
        role="draft",
    ),
    "gemma4-12x1024-f16": Preset(
        write_gemma4,
        {"shape": GEMMA4, "qtype": "f16", "noise": 1.1},
        "Gemma 4 layout (12 layers, 5 sliding to 1 full), F16",
        mtp="gemma4-assistant-4x256-f16",
    ),
    "gemma4-assistant-4x256-f16": Preset(
        write_gemma4_assistant,
        {
            "target": GEMMA4,
            "shape": AssistantShape(n_embd=256, n_layer=4, n_head=4, n_ff=1024),
            "qtype": "f16",
            "noise": 0.95,
        },
        "Gemma 4 MTP assistant, 4 layers x 256, F16",
        role="draft",
    ),
}


def write_all(out: Path, family: Family, names: list[str]) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    for name in names:
        p = PRESETS[name]
        start = time.perf_counter()
        path = p.writer(out / f"{name}.gguf", family=family, name=f"planted {name}", **p.kwargs)
        paths[name] = path
        size, took = path.stat().st_size / 2**20, time.perf_counter() - start
        print(f"{path}  {size:,.0f} MiB  {took:.0f} s  ({p.label})", flush=True)
    return paths


def check(out: Path, family: Family, names: list[str], n: int = 64) -> None:
    """Greedy text from each target; each drafter's agreement with it (see the module docstring)."""
    from specchat.llama.engine import LlamaModel, LoadOptions
    from tests.mtp_probe import mtp_agreement
    from tests.planted_measure import PROMPT, greedy, lookup_rate, measure_pair, planted_rate

    succ = family.succ()
    opts = LoadOptions(n_ctx=1024)
    for name in names:
        p = PRESETS[name]
        if p.role != "target":
            continue
        target = LlamaModel(out / f"{name}.gguf", opts)
        prompt = target.tokenize(PROMPT)
        for dname in p.drafts:
            with LlamaModel(out / f"{dname}.gguf", opts) as draft:
                r = measure_pair(target, draft, prompt, succ, n)
            print(
                f"{name} + {dname}: target follows the rule {r.target_rate:.2f}, draft {r.draft_rate:.2f}, "
                f"agreement {r.agreement:.2f}, lookup {r.lookup:.2f}, distinct {r.distinct:.2f}"
            )
        if p.mtp:
            target.close()
            assistant = None if p.mtp == "self" else out / f"{p.mtp}.gguf"
            acc, toks = mtp_agreement(out / f"{name}.gguf", prompt, n, assistant=assistant, n_ctx=1024)
            rate = planted_rate([prompt[-1], *toks], succ)
            print(
                f"{name} + MTP {p.mtp}: target follows the rule {rate:.2f}, MTP agreement {acc:.2f}, "
                f"lookup {lookup_rate(prompt, toks):.2f}"
            )
        elif not p.drafts:
            toks = greedy(target, prompt, n)
            print(f"{name}: follows the rule {planted_rate([prompt[-1], *toks], succ):.2f}")
        target.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=DEFAULT_OUT)
    vocab = ap.add_mutually_exclusive_group()
    vocab.add_argument("--tokenizer-from", type=Path, default=DEFAULT_TOKENIZER, metavar="GGUF")
    vocab.add_argument("--synthetic-vocab", type=int, metavar="N")
    ap.add_argument("--only", nargs="+", choices=sorted(PRESETS), metavar="NAME", help="write only these")
    ap.add_argument("--check", action="store_true", help="measure the written files (see above)")
    ap.add_argument("--no-write", action="store_true", help="with --check: measure files already written")
    args = ap.parse_args()
    if args.synthetic_vocab is not None:
        vocab_ = Vocab.synthetic(args.synthetic_vocab)
    elif args.tokenizer_from.is_file():
        vocab_ = Vocab.from_gguf(args.tokenizer_from)
    else:
        print(
            f"error: no GGUF at {args.tokenizer_from} to take the tokenizer from; pass --tokenizer-from "
            "PATH to another GGUF, or --synthetic-vocab 151936",
            file=sys.stderr,
        )
        return 2
    family = Family(vocab_)
    names = args.only or list(PRESETS)
    print(f"vocabulary: {vocab_.label}", flush=True)
    if not args.no_write:
        write_all(args.out, family, names)
    if args.check:
        check(args.out, family, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
