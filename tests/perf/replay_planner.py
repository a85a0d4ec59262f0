"""Replay recorded greedy outputs through the real loop and planner with a measured cost curve.

Not a test and not a measurement of speed: a way to compare planner policies on the same text in
seconds instead of a 15-minute benchmark. The target is replaced by a stand-in that returns, at each
position, the recorded token as argmax with the *real* top-2 gap there (teacher-forced once through
the real target), so the tie margin acts as it does live; each round is billed the calibrated V(n)
plus a measured per-round Python cost. Ratios are plain time / speculative time, both simulated.
README's "replayed offline" figures come from this script.

Usage:
  python tests/perf/replay_planner.py TARGET.gguf RESULTS.json... [--prompts FILE...] [--seeds 6]
                                     [--drafter SPEC] [--tree-width N] [--curves own|all] [--oracle]
                                     [--draft DRAFT.gguf --hardware]
                                     [--cache FILE [--gaps]] [--curve FILE|DIR... [--curve-only]]
  python tests/perf/replay_planner.py --cache FILE [--hardware] [--curve FILE|DIR...] ...
RESULTS.json is what `tests/perf/vs_llama_cpp.py --json --prompts FILE` writes (it holds each prompt's
plain output); FILE defaults to tests/perf/copy_prompts.jsonl (heldout_prompts.jsonl is a second set).
Several RESULTS files take one --prompts file each, in the same order.

`--draft DRAFT.gguf --hardware` teacher-forces the draft model once over every answer (replay_draft.py)
and replays the default run (draft model + n-gram, auto), specchat's and llama.cpp's fixed settings and
the hindsight bound over both drafters under published cost curves of other hardware
(tests/perf/curves/, replay_curves.py) and this machine's: docs/performance.md, "On other hardware".
The cost curve, tie margin and exact batch size are this target's own, as a live run gets them (from
the calibration cache, $SPECCHAT_HOME/calibration.json, else measured now); `--curves all` also replays
under every other verify curve cached there: the same VM measured V(4)/V(1) from 2.6 to 3.2 on
different days, and a policy change should win under both shapes, not only one.

`--drafter SPEC` replays another model-free drafter of decoding/registry.py than the n-gram one
(`answers`, `ngram:max_n=4`, a new one once it has its entry there): it is built from the registry,
and the planner takes its priors from it, as a live run does.

`--oracle` also prints, per prompt, the hindsight bound for the n-gram drafter: the best draft length for
every round chosen knowing the answer (dynamic programming over positions), with the tie margin
stopping rounds exactly as it does live. No planner can beat it with this drafter and curve, so it
says how much of a gap is the planner's and how much the hardware's.

`--cache FILE` keeps every answer's passes (and the prompt sets); given alone, without TARGET and
RESULTS, it replays from them with no model file at all (tests/perf/recorded/replay-cache.json.gz
is one, see tests/perf/recorded/README.md). `--curve FILE|DIR` adds cost curves in the format of
tests/perf/curves/ (tests/perf/device/ measures one on a GPU machine); `--curve-only` replays them alone.
`--gaps` records the real top-2 gaps even on a build whose every verify batch is exact, so the cache
also replays hardware whose batches are not (a curve that carries its own tie margin).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from specchat import store  # noqa: E402
from specchat.decoding import registry  # noqa: E402
from specchat.decoding.calibration import K_MAX, Costs, calibrate, exact_rows, tie_margin, trees_exact  # noqa: E402
from specchat.decoding.events import Done, Round  # noqa: E402
from specchat.decoding.loop import Settings, generate  # noqa: E402
from specchat.decoding.planner import AutoPlanner  # noqa: E402
from specchat.decoding.settings import AUTO_TREE_WIDTH, TREE_BRANCHES  # noqa: E402

sys.path.insert(0, str(HERE))
from replay_draft import ROUND_OVERHEAD, DraftTrace, billed, hindsight_seconds, teacher_force_draft  # noqa: E402

#: prompt categories that copy their input (the rest are judged on staying at plain speed)
COPYING = {"edit", "revision"}
#: the top-2 gap recorded where it is never read (every batch exact): far outside any tie margin
NO_TIE = 1e9


class Replay:
    """A stand-in target whose argmax at every position is the recorded output, with its real gap."""

    name = "replay"

    def __init__(self, prompt: list[int], output: list[int], gaps: list[float], vocab: int) -> None:
        self.seq, self.n_prompt, self.gaps, self.vocab = prompt + output, len(prompt), gaps, vocab
        self._tokens: list[int] = []

    n_ctx = 8192

    @property
    def n_vocab(self) -> int:
        return self.vocab

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    def decode(self, tokens, rows):  # type: ignore[no-untyped-def]
        base = len(self._tokens)
        self._tokens.extend(tokens)
        out = np.zeros((len(rows), self.vocab), dtype=np.float32)
        for j, r in enumerate(rows):
            n = base + r + 1
            nxt = self.seq[n] if n < len(self.seq) else 0
            out[j, nxt] = 10.0
            if 0 <= n - self.n_prompt < len(self.gaps):
                out[j, (nxt + 1) % self.vocab] = 10.0 - min(self.gaps[n - self.n_prompt], 9.0)
        return out

    def truncate(self, n: int) -> None:
        del self._tokens[n:]

    #: token trees (decoding/tree.TreeModel): as many side branches as a live target makes room for
    tree_branches = TREE_BRANCHES

    def decode_tree(self, tokens, shape, rows):  # type: ignore[no-untyped-def]
        """Each node's row as decode gives it at the node's depth: the recorded token there."""
        base = len(self._tokens)
        self._tree = (base, list(tokens))
        self._tokens.extend(tokens[: shape.chain])
        out = np.zeros((len(rows), self.vocab), dtype=np.float32)
        for j, r in enumerate(rows):
            n = base + shape.depth[r] + 1
            nxt = self.seq[n] if n < len(self.seq) else 0
            out[j, nxt] = 10.0
            if 0 <= n - self.n_prompt < len(self.gaps):
                out[j, (nxt + 1) % self.vocab] = 10.0 - min(self.gaps[n - self.n_prompt], 9.0)
        return out

    def keep_path(self, shape, path) -> None:  # type: ignore[no-untyped-def]
        base, tokens = self._tree
        self._tokens[base:] = [tokens[j] for j in path]

    def checkpoint(self) -> None:
        """Nothing to keep: the replayed cache drops any suffix."""

    def is_eog(self, token: int) -> bool:
        return False

    def token_bytes(self, token: int) -> bytes:
        return b"x"


def hindsight_ratio(
    prompt: list[int], output: list[int], gaps: list[float], curve: list[float], margin: float, exact_n: int
) -> float:
    """Plain time / the fastest schedule of rounds any planner could choose with the n-gram drafter
    (replay_draft.hindsight_seconds, which also knows the draft model)."""
    best = hindsight_seconds(prompt, output, gaps, curve, margin, exact_n)
    return len(output) * (curve[0] + ROUND_OVERHEAD) / best


def chatml(messages: list[dict[str, str]]) -> str:
    from vs_llama_cpp import chatml as render  # the same rendering the measurement used

    return render(messages)


def read_cache(path: Path) -> dict:  # type: ignore[type-arg]
    """A replay cache (--cache), plain or gzipped JSON."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)  # type: ignore[no-any-return]


def write_cache(path: Path, saved: dict) -> None:  # type: ignore[type-arg]
    text = json.dumps(saved).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


@dataclass(slots=True)
class Recorded:
    """Everything a replay reads from a cache that holds every answer's passes: each answer's prompt,
    output and top-2 gaps, the draft model's teacher-forced trace, which prompt set and category each
    answer belongs to, and the recording target's tie margin, exact batch size and verify curve."""

    cases: dict[str, tuple[list[int], list[int], list[float]]]
    traces: dict[str, DraftTrace]
    sets: dict[str, list[str]]
    categories: dict[str, str]
    margin: float
    exact_n: int
    curve: list[float]
    real_gaps: bool


def load_recorded(path: Path) -> Recorded:
    """A cache written with TARGET, RESULTS and --draft, read without them (no model is loaded)."""
    saved = read_cache(path)
    if "sets" not in saved or "traces" not in saved:
        raise SystemExit(
            f"{path} holds no prompt sets or draft passes (written before replay caches kept them, or "
            "without --draft): write it again with TARGET, RESULTS and --draft"
        )
    cases = {n: tuple(c) for n, c in saved["cases"].items()}
    return Recorded(
        cases=cases,  # type: ignore[arg-type]
        traces={n: DraftTrace(*saved["traces"][n]) for n in cases},
        sets={k: [n for n in v if n in cases] for k, v in saved["sets"].items()},
        categories=saved.get("categories", {}),
        margin=float(saved["margin"]),
        exact_n=int(saved["exact_n"]),
        curve=list(saved["curve"]),
        real_gaps=bool(saved.get("real_gaps", saved["exact_n"] <= K_MAX)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", default=None,
                    help="the target GGUF (without it, everything comes from --cache)")  # fmt: skip
    ap.add_argument("results", type=Path, nargs="*", help="one RESULTS.json per prompt set")
    ap.add_argument("--prompts", type=Path, nargs="+", default=[HERE / "copy_prompts.jsonl"],
                    help="the prompt file of each RESULTS.json, in the same order")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--drafter", default=registry.NGRAM,
                    help="the model-free drafter replayed (a decoding/registry.py spec)")  # fmt: skip
    ap.add_argument("--tree-width", type=int, default=AUTO_TREE_WIDTH,
                    help="side branches of its token trees, as `run --tree-width` (0: chains)")  # fmt: skip
    ap.add_argument("--curves", choices=("own", "all"), default="own")
    ap.add_argument("--oracle", action="store_true", help="also print the hindsight bound per prompt")
    ap.add_argument("--draft", default=None, help="the draft model GGUF: teacher-forced once (--hardware)")
    ap.add_argument(
        "--hardware",
        action="store_true",
        help="every policy under every curve in curves/ and this machine's (with --draft)",
    )
    ap.add_argument("--cache", type=Path, default=None,
                    help="keep the teacher-forced gaps (and draft passes) here and reuse them (replays "
                         "in seconds); delete it when RESULTS, the target or the draft change; .gz: "
                         "gzipped")  # fmt: skip
    ap.add_argument("--gaps", action="store_true",
                    help="record every position's real top-2 gap even on a build whose verify batches are "
                         "all exact (where they are never read), so the cache replays hardware whose "
                         "batches are not (a curve with its own tie margin: --curve)")  # fmt: skip
    ap.add_argument("--curve", type=Path, action="append", default=[],
                    help="a cost curve file (tests/perf/curves/ format) or a folder of them, replayed "
                         "too (repeatable)")  # fmt: skip
    ap.add_argument("--curve-only", action="store_true", help="replay under the --curve curves alone")
    ap.add_argument("--jobs", type=int, default=1, help="--hardware: replay answers in this many processes")
    args = ap.parse_args()
    if not registry.is_model_free(args.drafter):
        ap.error(f"--drafter takes a model-free drafter: {registry.described()}")
    registry.make(args.drafter)  # its options, checked before anything slow
    if args.curve_only and not args.curve:
        ap.error("--curve-only needs --curve")
    from replay_curves import from_paths

    extra = from_paths(args.curve)
    if args.target is None:
        if args.results or not (args.cache and args.cache.is_file()):
            ap.error("without TARGET, give --cache FILE written by an earlier run (and no RESULTS)")
        rec = load_recorded(args.cache)
        cases, traces, sets = rec.cases, rec.traces, rec.sets
        margin, exact_n, own, real_gaps = rec.margin, rec.exact_n, rec.curve, rec.real_gaps
        prompts = {n: {"category": rec.categories.get(n)} for n in cases}
    else:
        if not args.results:
            ap.error("give RESULTS.json after TARGET")
        if len(args.prompts) != len(args.results):
            ap.error("give one --prompts file per RESULTS.json")
        if args.hardware and not args.draft:
            ap.error("--hardware needs --draft")
        cases, traces, sets, prompts, margin, exact_n, own, real_gaps = record(args)
    if args.hardware:
        from replay_curves import measured_cpu, published
        from replay_hardware import report as report_hardware

        curves = extra if args.curve_only else measured_cpu(own) + published() + extra
        if not real_gaps and any(c.exact_n is not None and c.exact_n <= K_MAX for c in curves):
            print("note: this cache holds no real top-2 gaps (recorded where every verify batch was "
                  "exact; --gaps records them), so a curve with its own tie margin replays as if no "
                  "position were a near-tie")  # fmt: skip
        report_hardware(cases, traces, sets, curves, margin, exact_n, seeds=args.seeds, jobs=args.jobs)
        return
    curves = [] if args.curve_only else [own]
    if args.curves == "all" and not args.curve_only:  # every other verify curve cached here, measured earlier
        cal = store.read_json(store.home() / "calibration.json")
        curves += [v for k, v in cal.items() if k.startswith("verify:") and isinstance(v, list)
                   and len(v) == len(own) and v != own]  # fmt: skip
    curves += [c.verify for c in extra]
    report(
        cases,
        prompts,
        curves,
        margin,
        exact_n,
        seeds=args.seeds,
        oracle=args.oracle,
        drafter=args.drafter,
        tree_width=args.tree_width,
    )


def record(args: argparse.Namespace) -> tuple:  # type: ignore[type-arg]
    """The recorded answers' passes: from --cache when it holds them all, else teacher-forced now
    through the target (and the draft model), and written to --cache with the prompt sets."""
    recorded: dict = {}
    prompts: dict = {}
    sets: dict[str, list[str]] = {}
    for res_path, prompt_path in zip(args.results, args.prompts, strict=True):
        found = json.loads(res_path.read_text())["results"]
        recorded.update(found)
        sets[prompt_path.stem.removesuffix("_prompts")] = list(found)
        prompts.update({p["name"]: p for p in map(json.loads, prompt_path.read_text().splitlines()) if p})
    saved = read_cache(args.cache) if args.cache and args.cache.is_file() else None
    real = saved is not None and saved.get("real_gaps", saved["exact_n"] <= K_MAX)
    if saved is not None and set(saved["cases"]) >= set(recorded) and (real or not args.gaps):
        cases = {n: tuple(c) for n, c in saved["cases"].items() if n in recorded}
        margin, exact_n, own = saved["margin"], saved["exact_n"], saved["curve"]
    else:
        cases, margin, exact_n, own = teacher_force(args.target, recorded, prompts, gaps=args.gaps)
        traces_before = saved.get("traces", {}) if saved is not None else {}
        real = args.gaps or exact_n <= K_MAX
        saved = {"cases": cases, "margin": margin, "exact_n": exact_n, "curve": own, "real_gaps": real,
                 "traces": traces_before}  # fmt: skip
    saved["sets"] = {**saved.get("sets", {}), **sets}
    saved["categories"] = {**saved.get("categories", {}),
                           **{n: prompts[n].get("category") for n in recorded}}  # fmt: skip
    traces: dict[str, DraftTrace] = {}
    if args.draft:
        known = saved.get("traces", {})
        missing = {n: c for n, c in cases.items() if len(known.get(n, ())) < 4}  # second choices too
        if missing:
            forced = teacher_force_draft(args.draft, missing)
            known.update({n: [t.right, t.conf, t.second_right, t.second_share] for n, t in forced.items()})
        saved["traces"] = known
        traces = {n: DraftTrace(*known[n]) for n in cases}
    if args.cache:
        write_cache(args.cache, saved)
    return cases, traces, sets, prompts, margin, exact_n, own, real


def teacher_force(
    target: str, recorded: dict, prompts: dict, *, gaps: bool = False
) -> tuple[dict[str, tuple[list[int], list[int], list[float]]], float, int, list[float]]:
    """Each recorded answer's prompt, output and real top-2 gap at every position (one pass of the
    target, teacher-forced), with the target's tie margin, exact batch size and verify curve.
    `gaps`: measure the gaps even where this build never reads them (every batch exact)."""
    from specchat.llama.buildcheck import build_identity, verified_exact_rows
    from specchat.llama.devices import backend_info
    from specchat.llama.engine import GGML_TYPE_BF16, LlamaModel, LoadOptions

    cases = {}
    with LlamaModel(Path(target), LoadOptions(n_ctx=4096, type_v=GGML_TYPE_BF16)) as m:
        # this target's own measurements, as a live run gets them (from the cache, else measured)
        # (keyed and verified as loader.load does: the installed build's identity and its probe)
        ident = build_identity()
        backend = f"{backend_info().get('system_info', '')} build:{ident['key']}"
        verified = verified_exact_rows(ident)
        margin = tie_margin(m, backend=backend)
        exact_n = exact_rows(m, backend=backend, verified=verified)
        own = calibrate(m, [None], backend=backend).verify
        for name, runs in recorded.items():
            prompt = m.tokenize(chatml(prompts[name]["messages"]))
            output = runs["specchat plain"][0]["tokens"]
            if exact_n > K_MAX and not gaps:
                # every verify batch is bit-exact (the patched build): no row is ever judged against
                # the margin, so the gaps are never read and the one-token pass can be skipped
                cases[name] = (prompt, output, [NO_TIE] * len(output))
                continue
            m.truncate(0)
            m.decode(prompt[:-1], [])
            gaps = []
            seq = [prompt[-1], *output[:-1]]
            # batches of up to exact_n rows are bit-identical to one-token decoding on this build
            step = max(1, min(exact_n, 64))
            for start in range(0, len(seq), step):
                part = seq[start : start + step]
                rows = np.array(m.decode(part, list(range(len(part)))), copy=True)
                top2 = np.partition(rows, -2, axis=1)[:, -2:]
                gaps.extend(float(g) for g in top2[:, 1] - top2[:, 0])
            cases[name] = (prompt, output, gaps)
    return cases, margin, exact_n, own


def report(
    cases: dict,
    prompts: dict,
    curves: list[list[float]],
    margin: float,
    exact_n: int,
    *,
    seeds: int,
    oracle: bool,
    drafter: str = registry.NGRAM,
    tree_width: int = 0,
) -> None:
    """Replay every case under every curve with the model-free `drafter` (a registry spec) and print
    the ratios (and the hindsight bound), and how often the drafter's token-tree branches stood
    beside a rejected draft token and held the answer's token there."""
    tried = [0, 0]  # rounds with a branch beside the rejected draft token, and those that took one

    def ratio(name: str, seed: int, curve: list[float]) -> float:
        prompt, output, gaps = cases[name]
        ids = {t: i for i, t in enumerate(sorted({*prompt, *output, 0}))}
        p, o = [ids[t] for t in prompt], [ids[t] for t in output]
        bill = billed(curve)  # what each round costs here, and what a live planner measures it at
        d = registry.make(drafter, tree_width=tree_width)  # fresh per answer, as the bench resets drafters
        planner = AutoPlanner(
            Costs(bill, [0.0], exact_n=exact_n), [d.prior], model_free=[d.model is None],
            route_priors=[d.route_priors], rng=np.random.default_rng(seed), learn_costs=False,
        )  # fmt: skip
        spent, made = 0.0, 0
        settings = Settings(max_tokens=len(o), tie_margin=margin, exact_rows=exact_n,
                            exact_trees=trees_exact(exact_n))  # fmt: skip
        for ev in generate(Replay(p, o, gaps, len(ids)), p, drafters=[d], planner=planner,
                           settings=settings):  # fmt: skip
            if isinstance(ev, Round):
                spent += bill[min((ev.proposed or 0) + 1, len(bill)) - 1]
                tried[0] += ev.side_tried
                tried[1] += ev.side_tried and ev.side_accepted > 0
            elif isinstance(ev, Done):
                made = ev.stats.generated_tokens
        return made * bill[0] / spent

    def geomean(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")

    names = list(cases)
    copying = {n for n in names if prompts[n].get("category") in COPYING}
    for curve in curves:
        shape = ", ".join(f"V({n}) {curve[n - 1] / curve[0]:.2f}" for n in (2, 4, 16))
        tried[:] = [0, 0]
        res = {n: statistics.fmean(ratio(n, s, curve) for s in range(seeds)) for n in names}
        print(f"replayed {drafter} auto (simulated, not measured), curve {shape}: " + ", ".join(
            f"{n} {r:.2f}x" for n, r in res.items()
        ) + f"; geomean copying {geomean([res[n] for n in copying]):.3f}x, "
            f"others {geomean([res[n] for n in names if n not in copying]):.3f}x")  # fmt: skip
        if tree_width > 0:
            print(f"  token-tree branches beside a rejected draft token: {tried[0]} rounds "
                  f"({tried[0] / seeds:.0f} a seed), {tried[1]} of them taken")  # fmt: skip
        if oracle:
            bound = {n: hindsight_ratio(*cases[n], curve, margin, exact_n) for n in names}
            print("  hindsight bound (best k per round knowing the answer): " + ", ".join(
                f"{n} {r:.2f}x" for n, r in bound.items()
            ) + f"; geomean copying {geomean([bound[n] for n in copying]):.3f}x, "
                f"others {geomean([bound[n] for n in names if n not in copying]):.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
