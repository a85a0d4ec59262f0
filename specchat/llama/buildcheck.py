"""The llama.cpp build self-check: do quantised matmuls through the CPU kernels real models use compute
what they should, without crashing? Run by `make install`, read by `specchat doctor` and by every load.

Why: a build can pass every test with tiny float models and still die on its first real generation.
llama.cpp's CPU backend moves quantised weights into "extra buffer types" (CPU_REPACK; AMX on Xeons
built with -march=native), whose kernels only run for quantised tensors of certain shapes; on a VM whose
hypervisor does not keep AMX state the AMX path computes garbage and then dies of SIGILL. So the probe
writes a tiny llama GGUF whose weights are Q4_0, Q8_0, Q4_K and Q6_K with shapes those kernels accept
(see `PROBE_SHAPES`), evaluates it with extra buffers on at 1 row (GEMV) and 16 rows (GEMM, AMX tiles)
and compares with the same model loaded without extra buffers (the plain ggml kernels).

The probe runs in a child process (`python -m specchat.llama.buildcheck probe`), so an illegal instruction
kills the child, not the caller; the parent turns the exit status and the child's JSON into a verdict:
pass, wrong numbers, crashed, or could not run. The verdict is stored under the build's identity
(library files' paths, sizes and mtimes; llama-cpp-python's version), so a rebuild makes it stale.

`python -m specchat.llama.buildcheck install` is the end of `make install`: on a failed check it rebuilds
llama-cpp-python (same version, no wheel cache, explicit x86 flags from /proc/cpuinfo, never AMX, the
user's CMAKE_ARGS kept) and checks again. At run time nothing is probed: `refuse_known_bad()` reads the
stored verdict, and a build known to be bad is refused with one line saying how to fix it; a stock
build (not specchat's patched one) is used with one warning line saying how to get the patched one
(`build_warning()`; why a warning and not a refusal: `installed.Installed.warning`).

This module never imports llama_cpp itself: the child uses specchat.llama.engine, and the parent identifies
the build from the files on disk.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import store
from ..errors import EngineError
from . import build, child, installed, invariance
from .probe_model import PROBE_SHAPES, write_probe_gguf

CHECK_NAME = "quantised-matmul self-check (Q4_0, Q8_0, Q4_K, Q6_K through llama.cpp's CPU extra buffers)"
PASS, WRONG, CRASHED, NOT_RUN = "pass", "wrong numbers", "crashed", "could not run"
BAD = frozenset({WRONG, CRASHED})

#: Largest difference from the reference allowed, as max |logit - reference| over the logits' standard
#: deviation. Measured on an AMD EPYC (AVX512, CPU_REPACK; llama-cpp-python 0.3.36) over 5 seeds: extra
#: buffers on vs off differ by at most 3% (the repacked kernels quantise activations and sum in another
#: order), and one-row vs 16-row decoding with the plain kernels by up to 4% (Q4_K). A broken kernel
#: computes unrelated numbers, ~140% (two independent vectors of the same spread; the AMX fault gave
#: garbage text), so 25% sits well clear of both.
TOLERANCE = 0.25
PROBE_TIMEOUT = 180.0
PROBE_ROWS = 16
#: Q6_K: the x86 K-quant patch repacks it with AVX512 VNNI (its own kernel for every row count)
PROBE_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")

_SIGNAL_EXIT = 128  # a shell reports "killed by signal N" as 128 + N
#: signals that mean the build itself failed (not all exist on Windows)
_CRASH_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGILL", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGABRT")
    if hasattr(signal, name)
)


# --------------------------------------------------------------------------------------------------------
# The build's identity and the stored verdict


def build_identity() -> dict[str, Any]:
    """Which llama.cpp build is installed, from files on disk (nothing is imported or loaded).

    The key covers every shared library in llama_cpp/lib (libllama, libggml-cpu, ... : path, size,
    mtime) and the package version, so any reinstall or rebuild changes it.
    """
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    spec = importlib.util.find_spec("llama_cpp")
    libs: list[str] = []
    parts = [version]
    if spec is not None and spec.origin:
        lib_dir = Path(spec.origin).parent / "lib"
        for p in sorted(lib_dir.glob("*")) if lib_dir.is_dir() else []:
            if p.is_file() and not p.is_symlink() and any(s in p.name for s in (".so", ".dylib", ".dll")):
                st = p.stat()
                libs.append(str(p))
                parts += [str(p), str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return {"key": key, "version": version, "libraries": libs}


@dataclass(frozen=True)
class CheckResult:
    """One verdict about one build. `status` is PASS, WRONG, CRASHED or NOT_RUN; `detail` is one line."""

    status: str
    detail: str
    key: str = ""
    version: str = ""
    checked_at: float = 0.0
    buffers: tuple[str, ...] = ()  # extra buffer types the probe reached (CPU_REPACK, AMX, ...)
    cases: tuple[dict[str, Any], ...] = field(default=())
    #: the batch-invariance probe's verdict (invariance.to_row), {} when it was not run
    invariance: dict[str, Any] = field(default_factory=dict)

    @property
    def exactness(self) -> invariance.Invariance | None:
        """Whether verify batches round like one-token decoding on this build (None: not probed)."""
        return invariance.from_row(self.invariance) if self.invariance else None

    @property
    def bad(self) -> bool:
        return self.status in BAD

    def line(self) -> str:
        return f"llama.cpp build check: {self.status} — {self.detail}"


def results_file() -> Path:
    """Where verdicts are kept, beside the planner's calibration (store.home())."""
    return store.home() / "buildcheck.json"


def stored_result(identity: dict[str, Any] | None = None) -> CheckResult | None:
    """The verdict recorded for this build (or `identity`), or None when it was never checked."""
    ident = identity or build_identity()
    row = store.read_json(results_file()).get(ident["key"])
    if not isinstance(row, dict):
        return None
    try:
        return CheckResult(
            status=str(row["status"]),
            detail=str(row["detail"]),
            key=str(row.get("key", "")),
            version=str(row.get("version", "")),
            checked_at=float(row.get("checked_at", 0.0)),
            buffers=tuple(row.get("buffers", ())),
            cases=tuple(row.get("cases", ())),
            invariance=dict(row.get("invariance") or {}),
        )
    except (KeyError, TypeError, ValueError):
        return None


def verified_exact_rows(identity: dict[str, Any] | None = None) -> int:
    """Verify batches of up to this many rows equal one-token decoding bit for bit on the installed
    build, as its stored batch-invariance probe showed for every weight type (0: not shown). Never
    probes; the loaded target's calibration confirms it (decoding.calibration.exact_rows)."""
    result = stored_result(identity)
    verdict = result.exactness if result is not None else None
    return verdict.exact_rows if verdict is not None and verdict.passed else 0


def record(result: CheckResult, *, keep: int = 8) -> None:
    """Store a verdict under its build key (the newest `keep` builds are remembered); best effort."""
    path = results_file()
    data = store.read_json(path)
    data.pop(result.key, None)
    data[result.key] = asdict(result)
    for old in list(data)[:-keep]:
        del data[old]
    store.write_json(path, data)


class BrokenBuild(EngineError):
    """The installed llama.cpp build failed the self-check: using it would crash or compute garbage."""


def refuse_known_bad(identity: dict[str, Any] | None = None) -> None:
    """Raise BrokenBuild when this build is recorded as failing the check. Never probes (that is the
    install's job): an unchecked build is allowed, `specchat doctor` says it was not checked."""
    result = stored_result(identity)
    if result is None or not result.bad:
        return
    raise BrokenBuild(
        f"this llama.cpp build failed its self-check ({result.status}: {result.detail})",
        f"run `make install` to rebuild it for this CPU, or: {fix_command(result.version)}",
    )


def installed_build(identity: dict[str, Any] | None = None) -> installed.Installed:
    """Which build the identity (by default the installed one) names: specchat's patched one (and
    with which queue), a stock one, or none."""
    version = (identity or build_identity())["version"]
    return installed.describe(None if version == "not installed" else version)


def build_warning(identity: dict[str, Any] | None = None) -> str | None:
    """The line a model load says when the installed build is not this checkout's patched one (a
    stock llama-cpp-python, as `pip install .` outside the Makefile leaves): which build it is and
    how to get the patched one. None for the patched build. Never refuses (see `installed.Installed`)."""
    return installed_build(identity).warning()


def fix_command(version: str, cpuinfo: str | None = None, cmake_args: str | None = None) -> str:
    """The one shell command that rebuilds llama-cpp-python the way the install would."""
    args, env = rebuild_command(
        version,
        cpuinfo=build.read_cpuinfo() if cpuinfo is None else cpuinfo,
        cmake_args=os.environ.get("CMAKE_ARGS", "") if cmake_args is None else cmake_args,
        x86=can_rebuild(),
    )
    return f"CMAKE_ARGS={shlex.quote(env['CMAKE_ARGS'])} " + shlex.join(args)


# --------------------------------------------------------------------------------------------------------
# The verdict from the child's exit status and output


def decide(
    returncode: int | None, stdout: str, stderr: str, *, tolerance: float = TOLERANCE
) -> tuple[str, str, tuple[dict[str, Any], ...]]:
    """(status, one-line detail, cases) from what the probe child did. Pure, so it is tested directly.

    `returncode` None means the child timed out. The child prints `step ...` before each evaluation and
    one JSON object at the end, so a crash names the step it died in.
    """
    where = child.last_step(stdout)
    if returncode is None:
        return NOT_RUN, f"the probe did not finish within {PROBE_TIMEOUT:.0f} s{where}", ()
    sig = -returncode if returncode < 0 else returncode - _SIGNAL_EXIT if returncode > _SIGNAL_EXIT else 0
    if returncode < 0 or sig in _CRASH_SIGNALS:
        name = _signal_name(sig)
        return CRASHED, f"killed by {name}{where}", ()
    payload = child.report(stdout)
    if returncode != 0 or payload is None:
        tail = " ".join(stderr.strip().splitlines()[-1:])[-200:] or f"exit status {returncode}"
        return NOT_RUN, f"the probe failed{where}: {tail}", ()
    cases = tuple(c for c in payload.get("cases", []) if isinstance(c, dict))
    if not cases:
        return NOT_RUN, "the probe reported no results", ()
    worst = max(cases, key=lambda c: _relative(c))
    rel = _relative(worst)
    label = f"{worst.get('type')} {worst.get('variant')}"
    if rel > tolerance:
        shown = "not finite" if rel == float("inf") else f"{rel:.0%} of the logits' spread"
        return WRONG, f"{label} differs from the reference by {shown}", cases
    types = ", ".join(dict.fromkeys(str(c.get("type")) for c in cases))
    return PASS, f"{types} agree with the reference (worst {label}: {rel:.2%})", cases


def _relative(case: dict[str, Any]) -> float:
    try:
        diff, scale = float(case["max_abs"]), float(case["scale"])
    except (KeyError, TypeError, ValueError):
        return float("inf")
    if diff != diff or scale != scale or diff == float("inf"):  # NaN or inf
        return float("inf")
    return diff / max(scale, 1e-6)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def seen_buffers(stderr: str) -> tuple[str, ...]:
    """Extra buffer types named in llama.cpp's load log ("CPU_REPACK model buffer size = ...")."""
    found = []
    for line in stderr.splitlines():
        if "model buffer size" in line:
            name = line.split("model buffer size")[0].split(":")[-1].strip()
            if name and name != "CPU" and name not in found and "Mapped" not in name:
                found.append(name)
    return tuple(found)


Runner = Callable[[Sequence[str], float], tuple[int | None, str, str]]


def _run_child(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, out, ""
    return done.returncode, done.stdout, done.stderr


def probe_command() -> list[str]:
    return [sys.executable, "-m", "specchat.llama.buildcheck", "probe"]


def run_check(
    *,
    command: Sequence[str] | None = None,
    runner: Runner = _run_child,
    identity: dict[str, Any] | None = None,
    store: bool = True,
    timeout: float = PROBE_TIMEOUT,
    exactness: Callable[[], invariance.Invariance] | None = None,
) -> CheckResult:
    """Probe the installed build in a child process, decide, and (by default) record the verdict.

    `exactness` (e.g. invariance.run_probe) also runs the batch-invariance probe when the build
    passed, and stores its verdict with this one (make install and `check` do; tests need not)."""
    ident = identity or build_identity()
    returncode, out, err = runner(list(command or probe_command()), timeout)
    status, detail, cases = decide(returncode, out, err)
    exact = exactness() if exactness is not None and status == PASS else None
    result = CheckResult(
        status=status,
        detail=detail,
        key=ident["key"],
        version=ident["version"],
        checked_at=time.time(),
        buffers=seen_buffers(err),
        cases=cases,
        invariance=invariance.to_row(exact) if exact is not None else {},
    )
    if store:
        record(result)
    return result


# --------------------------------------------------------------------------------------------------------
# Rebuilding for this CPU


def rebuild_command(
    version: str, *, cpuinfo: str, cmake_args: str, python: str = sys.executable, x86: bool = True
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) to rebuild llama-cpp-python `version` from source for this CPU.
    A patched build (`version` 0.3.36+specchat.<queue>) is rebuilt by specchat.llama.build, whose
    wheel cache is keyed by CMAKE_ARGS, so the wheel that failed is not handed back either.

    `--no-cache-dir` because pip's wheel cache would hand back the wheel that failed, whatever the
    flags; `--no-binary` so a prebuilt wheel on an extra index cannot stand in either. On x86 the
    user's CMAKE_ARGS (CUDA, ...) come after our SIMD flags, less the options that re-enable native or
    AMX code; elsewhere (macOS, ARM) only the user's CMAKE_ARGS are passed: a clean build from source.
    """
    flags = shlex.split(build.explicit_x86_args(cpuinfo, cmake_args) if x86 else cmake_args)
    if f"+{build.LOCAL_TAG}." in version:  # specchat's patched build: rebuild it, patches and all
        return [python, "-m", "specchat.llama.build", "install", "--force"], {"CMAKE_ARGS": " ".join(flags)}
    argv = [python, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps"]
    argv += ["--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}"]
    return argv, {"CMAKE_ARGS": " ".join(flags)}


def can_rebuild(system: str | None = None, machine: str | None = None) -> bool:
    """Only x86-64 Linux gets an automatic rebuild: the flags come from /proc/cpuinfo's x86 names.
    macOS builds (Metal, Accelerate) and ARM are only checked."""
    return build.is_x86_linux(system, machine)


def install(
    *,
    dry_run: bool = False,
    check: Callable[[], CheckResult] | None = None,
    rebuild: Callable[[list[str], dict[str, str]], int] | None = None,
    say: Callable[[str], None] = print,
    cpuinfo: str | None = None,
    cmake_args: str | None = None,
    rebuildable: bool | None = None,
) -> int:
    """The end of `make install`: check; on a bad verdict rebuild once for this CPU and check again.

    Returns the exit status: 0 when the build passed (or the probe could not run, which is reported
    but does not block an install), 1 when a bad build remains.
    """
    check = check or full_check
    result = check()
    say(result.line())
    verdict = result.exactness
    if verdict is not None:
        say(verdict.line())
    if not result.bad and not dry_run:
        return 0
    version = result.version or build_identity()["version"]
    rebuildable = can_rebuild() if rebuildable is None else rebuildable
    argv, env = rebuild_command(
        version,
        cpuinfo=build.read_cpuinfo() if cpuinfo is None else cpuinfo,
        cmake_args=os.environ.get("CMAKE_ARGS", "") if cmake_args is None else cmake_args,
        x86=rebuildable,
    )
    fix = f"CMAKE_ARGS={shlex.quote(env['CMAKE_ARGS'])} {shlex.join(argv)}"
    if not rebuildable:
        say(f"specchat will refuse this build; rebuild llama-cpp-python for this machine: {fix}")
        return 1
    if dry_run and not result.bad:
        say(f"nothing to rebuild; a failed check would run: {fix}")
        return 0
    if dry_run:
        say(f"would rebuild llama-cpp-python {version} for this CPU without AMX or the wheel cache: {fix}")
        return 1
    say(
        f"rebuilding llama-cpp-python {version} for this CPU without AMX or the wheel cache "
        f"(about 10 minutes on 2 cores): CMAKE_ARGS={shlex.quote(env['CMAKE_ARGS'])}"
    )
    rc = (rebuild or _pip)(argv, env)
    if rc == 0:
        result = check()
        say(result.line())
        if result.status == PASS:
            return 0
    say(
        "the rebuilt llama.cpp still fails its check: specchat refuses it. Try a build without AVX512: "
        f"CMAKE_ARGS={shlex.quote(_no_avx512(env['CMAKE_ARGS']))} {shlex.join(argv)}; "
        "please report `specchat doctor --json` with it"
    )
    return 1


def full_check() -> CheckResult:
    """The self-check and, when it passes, the batch-invariance probe: what `make install` runs."""
    return run_check(exactness=invariance.run_probe)


def _no_avx512(cmake_args: str) -> str:
    return " ".join(
        a.replace("=ON", "=OFF") if a.startswith("-DGGML_AVX512") else a for a in cmake_args.split()
    )


def _pip(argv: list[str], env: dict[str, str]) -> int:
    """Run pip with its output in a log file (one line on screen, the log's path on failure).

    The wheel that failed is first dropped from pip's cache, so no later install gets it back.
    """
    log = results_file().with_name("llama-cpp-python-rebuild.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        subprocess.call(
            [argv[0], "-m", "pip", "cache", "remove", "llama_cpp_python"], stdout=handle, stderr=handle
        )
        rc = subprocess.call(argv, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT)
    if rc != 0:
        print(f"the rebuild failed (exit {rc}); pip's output is in {log}")
    return rc


# --------------------------------------------------------------------------------------------------------
# The probe model and the child process


def _evaluate(
    path: Path, *, repack: bool, tokens: Sequence[int], say: Callable[[str], None]
) -> dict[str, Any]:
    """Logits of `tokens` decoded as one batch and one token at a time, with or without extra buffers."""
    import numpy as np

    from .engine import LlamaModel, LoadOptions

    opts = LoadOptions(n_ctx=PROBE_SHAPES["n_ctx"], gpu_layers=0, threads=min(4, os.cpu_count() or 1),
                       verbose=True, repack=repack)  # fmt: skip
    label = "extra buffers on" if repack else "extra buffers off"
    with LlamaModel(path, opts) as model:
        say(f"{path.stem.rsplit('-', 1)[-1]}, {label}, {len(tokens)} rows")
        batch = np.array(model.decode(tokens, list(range(len(tokens)))), dtype=np.float64)
        model.truncate(0)
        say(f"{path.stem.rsplit('-', 1)[-1]}, {label}, 1 row")
        single = np.concatenate([np.array(model.decode([t], [0]), dtype=np.float64) for t in tokens])
    return {"batch": batch, "single": single}


def _probe_main(types: Iterable[str] = PROBE_TYPES) -> int:
    """The child: print `step ...` lines as it goes, then one JSON object with the differences."""
    import numpy as np

    def say(step: str) -> None:
        print(f"step {step}", flush=True)

    tokens = [int(t) for t in np.random.default_rng(7).integers(3, 259, PROBE_ROWS)]
    cases = []
    with tempfile.TemporaryDirectory(prefix="specchat-buildcheck-") as tmp:
        for qtype in types:
            path = write_probe_gguf(Path(tmp) / f"probe-{qtype}.gguf", qtype, seed=1)
            ref = _evaluate(path, repack=False, tokens=tokens, say=say)
            got = _evaluate(path, repack=True, tokens=tokens, say=say)
            scale = float(np.std(ref["batch"]))
            for variant, value in (
                (f"extra buffers, {PROBE_ROWS} rows", got["batch"]),
                ("extra buffers, 1 row", got["single"]),
                ("plain kernels, 1 row", ref["single"]),
            ):
                diff = float(np.max(np.abs(value - ref["batch"])))
                cases.append({"type": qtype, "variant": variant, "max_abs": diff, "scale": scale})
    print(json.dumps({"cases": cases}), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specchat.llama.buildcheck probe | check | install [--dry-run]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "check"
    if command == "probe":
        return _probe_main()
    if command == "check":
        result = full_check()
        print(result.line())
        if result.exactness is not None:
            print(result.exactness.line())
        return 1 if result.bad else 0
    if command == "install":
        return install(dry_run="--dry-run" in args[1:])
    print(f"usage: python -m specchat.llama.buildcheck probe|check|install [--dry-run] (got {command!r})")
    return 2


if __name__ == "__main__":
    sys.exit(main())
