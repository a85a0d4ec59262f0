"""The patched llama-cpp-python that `make install` builds: the pinned sdist, with specchat's patch queue
(`patches/llama.cpp/*.patch`) applied to the llama.cpp it vendors, built once into a wheel cache and
installed from there.

Why patch at all: llama.cpp's CPU backend picks its matmul and attention kernels by batch size, so a
verify batch of n tokens rounds differently from decoding them one at a time, and greedy speculative
decoding can part from plain decoding at a near-tie. The queue makes every batch of up to 63 rows
round like one row (each patch's header says what and why); `specchat.llama.invariance` checks the
installed build does, and the planner trusts every verify row only then.

Why a wheel cache: the build takes ~15 minutes on 2 cores. The cache key covers everything that changes
the binary (version, the patches' bytes, CMAKE_ARGS, the machine and its CPU flags), so a reinstall
with the same inputs -- a fresh clone's `make install`, CI -- installs the cached wheel in seconds,
and any change builds anew. The wheel carries a PEP 440 local version (`0.3.36+specchat.<queue hash>`),
which still satisfies pyproject.toml's `llama-cpp-python==0.3.36` and tells `specchat doctor` which queue
it holds.

A plain `pip install specchat` (or `pip install .` in a checkout) never comes here: it gets stock
llama-cpp-python at the pinned version (pyproject.toml's requirement is `==PINNED`, which the patched
wheel's local version also satisfies), which works as before (the invariance probe then reports where
its batches part and the planner keeps its tie margin). It is not silent about it: `llama/installed.py`
tells the patched build from the stock one by that local version, every model load says in one line
that a stock build is in use and how to get the patched one, and `specchat doctor` shows which build
is installed.

Metal builds (macOS, or CMAKE_ARGS with -DGGML_METAL=ON) also take the queue's Metal patch, which
only changes which Metal kernels verify batches run; should that build fail to compile, it is built
again without it (never a broken install), and the build's checks then decide what is exact.

The queue applies patch by patch with a three-way fallback (`patchqueue`), and
`python -m specchat.llama.build rebase --sdist PATH.tar.gz` (or `--version X`) tries it on another
llama-cpp-python release, reporting per patch: clean, applied with a 3-way merge, or failed (with
the files).

Standard library only: it runs in a fresh venv before specchat's dependencies are installed
(`python -m specchat.llama.build install`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import patchqueue

#: the llama-cpp-python release whose vendored llama.cpp the patch queue is written against; pyproject.toml
#: requires exactly this release (`llama-cpp-python==PINNED`, tests/test_build_queue.py checks it), so a
#: `pip install .` outside the Makefile gets the release the queue and the engine are written for
PINNED = "0.3.36"
PACKAGE = "llama-cpp-python"
LOCAL_TAG = "specchat"


def repo_root() -> Path:
    """The checkout this module runs from (specchat/llama/build.py -> the repository root)."""
    return Path(__file__).resolve().parents[2]


def patch_queue(root: Path | None = None) -> list[Path]:
    """The patches in apply order (their file names sort as NNNN-...); empty outside a checkout."""
    folder = (root or repo_root()) / "patches" / "llama.cpp"
    return sorted(folder.glob("*.patch")) if folder.is_dir() else []


def queue_hash(patches: Sequence[Path]) -> str:
    """Ten hex digits naming the queue: its file names and their diffs, in order. A patch's header
    (the text before its first `diff --git`, which `git apply` skips) is left out, so rewording why
    a patch exists does not rebuild llama-cpp-python."""
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + patch_body(p.read_bytes()) + b"\0")
    return h.hexdigest()[:10]


def patch_body(data: bytes) -> bytes:
    """A patch file from its first `diff --git` line on (all of it when it has none)."""
    start = data.find(b"diff --git ")
    while start > 0 and data[start - 1 : start] != b"\n":
        start = data.find(b"diff --git ", start + 1)
    return data[start:] if start >= 0 else data


def local_version(version: str, patches: Sequence[Path]) -> str:
    """The version the patched wheel carries, e.g. 0.3.36+specchat.1a2b3c4d5e."""
    return f"{version}+{LOCAL_TAG}.{queue_hash(patches)}"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_queue(version: str | None = None) -> str | None:
    """The queue hash of the installed llama-cpp-python, or None when it is not a specchat build."""
    version = installed_version() if version is None else version
    if not version or f"+{LOCAL_TAG}." not in version:
        return None
    return version.split(f"+{LOCAL_TAG}.", 1)[1]


def cache_dir() -> Path:
    """Where built wheels and the downloaded sdist are kept ($SPECCHAT_BUILD_CACHE, else the user's
    cache folder): outside the checkout, so a fresh clone finds them."""
    env = os.environ.get("SPECCHAT_BUILD_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specchat" / "llama-cpp-python"


#: llama.cpp CMake option -> the /proc/cpuinfo flags it compiles for (GGML_AVX512 adds -mavx512f, cd,
#: vl, dq and bw: ggml-cpu/CMakeLists.txt). GGML_NATIVE=OFF builds exactly these, and never AMX.
CPU_FLAG_OPTIONS: tuple[tuple[str, frozenset[str]], ...] = (
    ("GGML_SSE42", frozenset({"sse4_2"})),
    ("GGML_AVX", frozenset({"avx"})),
    ("GGML_AVX2", frozenset({"avx2"})),
    ("GGML_FMA", frozenset({"fma"})),
    ("GGML_F16C", frozenset({"f16c"})),
    ("GGML_BMI2", frozenset({"bmi2"})),
    ("GGML_AVX_VNNI", frozenset({"avx_vnni"})),
    ("GGML_AVX512", frozenset({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"})),
    ("GGML_AVX512_VBMI", frozenset({"avx512vbmi"})),
    ("GGML_AVX512_VNNI", frozenset({"avx512_vnni"})),
    ("GGML_AVX512_BF16", frozenset({"avx512_bf16"})),
)
#: options taken out of the user's CMAKE_ARGS: they would bring back -march=native or AMX
OVERRIDDEN = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_CPU_ALL_VARIANTS")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cmake_flags(cpuinfo: str) -> list[str]:
    """-DGGML_...=ON/OFF for this CPU's SIMD extensions, with native detection and AMX off."""
    flags = cpu_flags(cpuinfo)
    out = ["-DGGML_NATIVE=OFF"]
    out += [f"-D{option}={'ON' if needs <= flags else 'OFF'}" for option, needs in CPU_FLAG_OPTIONS]
    out += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return out


def explicit_x86_args(cpuinfo: str, cmake_args: str) -> str:
    """CMAKE_ARGS for an x86 build with this CPU's SIMD flags named one by one (never native, never AMX),
    followed by the user's own options (CUDA, ...) less those that would bring native or AMX back."""
    user = [a for a in shlex.split(cmake_args) if not any(a.startswith(f"-D{o}") for o in OVERRIDDEN)]
    return " ".join([*cmake_flags(cpuinfo), *user])


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def is_x86_linux(system: str | None = None, machine: str | None = None) -> bool:
    """x86-64 Linux: where /proc/cpuinfo's flag names map onto llama.cpp's SIMD options."""
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    return system == "Linux" and machine in ("x86_64", "amd64")


_CMAKE_TRUE = frozenset({"1", "ON", "YES", "TRUE", "Y"})


def cmake_option_on(cmake_args: str, option: str) -> bool:
    """Whether CMAKE_ARGS set a CMake option to a true value (the last -DOPTION[:BOOL]=VALUE wins)."""
    value = ""
    for arg in shlex.split(cmake_args):
        found = re.fullmatch(rf"-D{re.escape(option)}(?::BOOL)?=(.*)", arg)
        if found:
            value = found.group(1).strip().upper()
    return value in _CMAKE_TRUE or (value.lstrip("-").isdigit() and int(value) != 0)


def is_metal_build(cmake_args: str, system: str | None = None) -> bool:
    """Whether the build compiles llama.cpp's Metal backend, and so takes the queue's Metal patch: every
    macOS build (llama-cpp-python's CMakeLists forces GGML_METAL on for APPLE, Intel or Apple silicon,
    whatever CMAKE_ARGS say), elsewhere only one whose CMAKE_ARGS turn GGML_METAL on."""
    return (system or platform.system()) == "Darwin" or cmake_option_on(cmake_args, "GGML_METAL")


def first_build_args(cmake_args: str, *, cpuinfo: str | None = None, x86: bool | None = None) -> str:
    """CMAKE_ARGS for the patched build's first try.

    On an x86 CPU that lists AMX the build names its SIMD flags instead of -march=native, which would
    compile llama.cpp's AMX kernels: they are not batch-invariant (one row takes a VNNI kernel, more
    rows AMX tiles, so the invariance probe fails and the planner falls back to its tie margin), and
    on VMs whose hypervisor does not keep AMX state they compute garbage and die of SIGILL, which cost
    a second 15-minute build after the self-check. Elsewhere, or when the user already chose
    GGML_NATIVE or AMX, the user's CMAKE_ARGS go through unchanged.
    """
    chosen = "GGML_NATIVE" in cmake_args or "GGML_AMX" in cmake_args
    if chosen or not (is_x86_linux() if x86 is None else x86):
        return cmake_args
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    if not any(flag.startswith("amx") for flag in cpu_flags(cpuinfo)):
        return cmake_args
    return explicit_x86_args(cpuinfo, cmake_args)


def with_rpc(cmake_args: str) -> str:
    """CMAKE_ARGS with llama.cpp's RPC backend on (`-DGGML_RPC=ON`), on every platform, unless the user's
    CMAKE_ARGS already say GGML_RPC either way.

    Why always: `specchat worker` serves this build's devices to another machine and `--rpc` places a
    target's layers on such workers; both need ggml-rpc, and a worker must compute with the same patched
    kernels as the main process (a stock ggml-rpc-server would round verify batches differently). The
    backend only adds a device when `--rpc` names a worker, so a build that never uses it computes as
    before. The flag is part of CMAKE_ARGS and so of the wheel-cache key: a cached wheel built without
    RPC is never handed back for this build."""
    if any(re.fullmatch(r"-DGGML_RPC(?::BOOL)?=.*", a) for a in shlex.split(cmake_args)):
        return cmake_args
    return " ".join(filter(None, [cmake_args, "-DGGML_RPC=ON"]))


def build_args(cmake_args: str) -> str:
    """CMAKE_ARGS for `make install`'s build: the first try's (`first_build_args`) with RPC on."""
    return with_rpc(first_build_args(cmake_args))


def _cpu_flags() -> str:
    """This CPU's flags as one sorted string (part of the wheel-cache key); the processor's name where
    /proc/cpuinfo lists none (macOS, ...)."""
    return " ".join(sorted(cpu_flags(read_cpuinfo()))) or platform.processor()


def build_key(version: str, patches: Sequence[Path], cmake_args: str, cpu: str | None = None) -> str:
    """What the binary depends on, hashed: a native build is only good on CPUs with the same flags."""
    parts = [
        version,
        queue_hash(patches),
        " ".join(shlex.split(cmake_args)),
        platform.system(),
        platform.machine(),
        _cpu_flags() if cpu is None else cpu,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class BuildError(RuntimeError):
    """One line saying what failed and where the log is."""


Say = Callable[[str], None]


def _say(text: str) -> None:
    print(text, flush=True)  # make and CI read a pipe: a long build's notes must not wait in a buffer


def _run_logged(argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None,
                cwd: Path | None = None, say: Say = _say, what: str = "") -> int:  # fmt: skip
    """Run a long command with its output in `log`, saying every minute that it is still going."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"\n$ {shlex.join(argv)}\n")
        handle.flush()
        proc = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        start = time.monotonic()
        next_note = 60.0
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                elapsed = time.monotonic() - start
                if what and elapsed >= next_note:
                    say(f"  ... {what}: {elapsed / 60:.0f} min")
                    next_note += 60.0
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    return proc.returncode


def fetch_sdist(version: str, *, python: str = sys.executable, say: Say = _say) -> Path:
    """The pinned sdist, downloaded once from the package index into the cache."""
    folder = cache_dir() / "sdist"
    name = f"llama_cpp_python-{version}.tar.gz"
    path = folder / name
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    say(f"downloading the {PACKAGE} {version} source")
    argv = [python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    argv += [f"{PACKAGE}=={version}", "-d", str(folder)]
    if subprocess.call(argv) != 0 or not path.is_file():
        raise BuildError(f"could not download {PACKAGE} {version}'s source from the package index")
    return path


def apply_patches(llama_dir: Path, patches: Sequence[Path], *, say: Say | None = None) -> None:
    """Apply the queue to a vendored llama.cpp tree, patch by patch: as it is where it fits, merged
    three ways where its context moved (patchqueue). A patch that does not apply is named with its
    files, and nothing after it is applied."""
    try:
        results = patchqueue.apply_queue(llama_dir, patches)
    except (OSError, RuntimeError) as exc:  # no git, or git itself failed
        raise BuildError(f"could not apply the patch queue in {llama_dir}: {exc}") from exc
    for result in results:
        if result.status == patchqueue.FAILED:
            files = f" ({', '.join(result.files)})" if result.files else ""
            raise BuildError(f"{result.patch} does not apply to {llama_dir}{files}: {result.detail}")
        if result.status == patchqueue.MERGED and say is not None:
            say(f"  {result.line()}")


def prepare_source(sdist: Path, patches: Sequence[Path], workdir: Path, version: str, *,
                   say: Say | None = None) -> Path:  # fmt: skip
    """Unpack the sdist into `workdir`, apply the queue to vendor/llama.cpp and stamp the local
    version into llama_cpp/__init__.py (scikit-build-core reads the wheel's version from there)."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.12+ (and security releases): refuse odd members
            tar.extractall(workdir, filter="data")
        else:
            tar.extractall(workdir)
    roots = [p for p in workdir.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise BuildError(f"unexpected layout in {sdist.name}")
    src = roots[0]
    apply_patches(src / "vendor" / "llama.cpp", patches, say=say)
    init = src / "llama_cpp" / "__init__.py"
    text = init.read_text()
    base = version.split("+", 1)[0]
    stamped = text.replace(f'__version__ = "{base}"', f'__version__ = "{version}"')
    if stamped == text:
        raise BuildError(f"could not find __version__ = {base!r} in {init}")
    init.write_text(stamped)
    return src


def cached_wheel(key: str) -> Path | None:
    folder = cache_dir() / "wheels" / key
    wheels = sorted(folder.glob("llama_cpp_python-*.whl")) if folder.is_dir() else []
    return wheels[-1] if wheels else None


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (llama_cpp_python-0.3.36+specchat.1a2b3c4d5e-py3-...whl)."""
    return wheel.name.split("-")[1]


#: compiles an unpacked, patched source tree into a wheel in `staging`: (src, staging, env, log) -> exit
#: status (pip by default; the tests pass a fake)
Builder = Callable[[Path, Path, dict[str, str], Path], int]


def build_wheel(*, version: str = PINNED, patches: Sequence[Path] | None = None, cmake_args: str = "",
                python: str = sys.executable, say: Say = _say,
                builder: Builder | None = None) -> Path:  # fmt: skip
    """The patched wheel for these inputs: from the cache, else built (and then cached).

    `patches` is the whole queue; a build takes the patches `patchqueue.for_build` selects (the Metal
    patch on Metal builds only). Should a build with the Metal patch fail, it is built once more
    without it and that wheel is cached under the same key, so a reinstall does not fail again: its
    version names the queue it holds, and the build's checks decide what is exact."""
    queue = patch_queue() if patches is None else list(patches)
    key = build_key(version, queue, cmake_args)
    hit = cached_wheel(key)
    if hit is not None:
        say(f"using the cached patched {PACKAGE} wheel {hit.name}")
        return hit
    sdist = fetch_sdist(version, python=python, say=say)
    log = cache_dir() / "build.log"
    log.unlink(missing_ok=True)  # one build's output per log
    if builder is None:

        def builder(src: Path, staging: Path, env: dict[str, str], log: Path) -> int:
            argv = [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(staging), str(src)]
            return _run_logged(argv, log, env=env, say=say, what="still building")

    chosen = patchqueue.for_build(queue, is_metal_build(cmake_args))
    try:
        return _build(sdist, chosen, version, cmake_args, key, log, builder, say)
    except BuildError as exc:
        without = [p for p in chosen if not patchqueue.is_metal_patch(p)]
        if len(without) == len(chosen):
            raise
        say(f"{exc}; building again without the Metal patch ({', '.join(_numbers(chosen, without))})")
        return _build(sdist, without, version, cmake_args, key, log, builder, say)


def _numbers(chosen: Sequence[Path], kept: Sequence[Path]) -> list[str]:
    return [p.name.split("-", 1)[0] for p in chosen if p not in kept]


def _build(sdist: Path, patches: Sequence[Path], version: str, cmake_args: str, key: str, log: Path,
           builder: Builder, say: Say) -> Path:  # fmt: skip
    """Unpack, patch and compile once; the wheel is moved into the cache under `key`."""
    shown = f" CMAKE_ARGS={shlex.quote(cmake_args)}" if cmake_args else ""
    say(
        f"building {PACKAGE} {version} with {len(patches)} llama.cpp patches (about 15 minutes on 2 "
        f"cores, once; log: {log}){shown}"
    )
    with tempfile.TemporaryDirectory(prefix="specchat-llama-build-") as tmp:
        src = prepare_source(sdist, patches, Path(tmp), local_version(version, patches), say=say)
        staging = Path(tmp) / "wheel"
        rc = builder(src, staging, {**os.environ, "CMAKE_ARGS": cmake_args}, log)
        built = sorted(staging.glob("llama_cpp_python-*.whl"))
        if rc != 0 or not built:
            raise BuildError(f"building {PACKAGE} failed (exit {rc}); the build log is {log}")
        out = cache_dir() / "wheels" / key
        out.mkdir(parents=True, exist_ok=True)
        target = out / built[-1].name
        shutil.move(str(built[-1]), target)
    return target


def install_wheel(wheel: Path, *, python: str = sys.executable, say: Say = _say) -> None:
    """Install the wheel in place of whatever llama-cpp-python is there (its dependencies too)."""
    log = cache_dir() / "install.log"
    argv = [python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)]
    if _run_logged(argv, log, say=say) != 0:
        raise BuildError(f"pip could not install {wheel.name}; see {log}")
    deps = [python, "-m", "pip", "install", "-q", str(wheel)]  # numpy, diskcache, ... if missing
    if _run_logged(deps, log, say=say) != 0:
        raise BuildError(f"pip could not install the dependencies of {wheel.name}; see {log}")


def install(*, cmake_args: str | None = None, force: bool = False, say: Say = _say) -> int:
    """`make install`'s first step: the patched llama-cpp-python, from the cache when it can.

    Returns 0 when the patched build is installed (or already was), 1 with one line on failure."""
    cmake_args = build_args(os.environ.get("CMAKE_ARGS", "")) if cmake_args is None else cmake_args
    queue = patch_queue()
    if not queue:
        say("no patches/llama.cpp queue here: keeping the stock llama-cpp-python")
        return 0
    hit = cached_wheel(build_key(PINNED, queue, cmake_args))
    if not force and hit is not None and installed_version() == wheel_version(hit):
        say(f"{PACKAGE} {wheel_version(hit)} (patched) is installed")
        return 0
    try:
        wheel = build_wheel(cmake_args=cmake_args, patches=queue, say=say)
        install_wheel(wheel, say=say)
    except BuildError as exc:
        say(f"error: {exc}")
        return 1
    held = next(
        (ps for ps in _selections(queue, cmake_args) if local_version(PINNED, ps) == wheel_version(wheel)), []
    )
    names = ", ".join(p.name.split("-", 1)[0] for p in held) or "see its version"
    say(f"installed {PACKAGE} {wheel_version(wheel)} (patched: {names})")
    return 0


def _selections(queue: Sequence[Path], cmake_args: str) -> list[list[Path]]:
    """The patch sets a wheel for these inputs may hold: the build's choice, then that less Metal."""
    chosen = patchqueue.for_build(queue, is_metal_build(cmake_args))
    return [chosen, [p for p in chosen if not patchqueue.is_metal_patch(p)]]


def pinned_sdist(*, say: Say = _say) -> Path:
    """The pinned release's sdist: the cached one, else downloaded."""
    cached = cache_dir() / "sdist" / f"llama_cpp_python-{PINNED}.tar.gz"
    return cached if cached.is_file() else fetch_sdist(PINNED, say=say)


def rebase_report(target: Path, *, patches: Sequence[Path] | None = None, write: Path | None = None,
                  say: Say = _say) -> int:  # fmt: skip
    """Try the whole queue on another llama-cpp-python sdist (three ways where a patch does not fit as
    it is) and report per patch: clean, applied with a 3-way merge, or failed with its files. 0 when
    every patch applies, 1 when one does not, 2 when it could not be tried."""
    queue = patch_queue() if patches is None else list(patches)
    if not queue:
        say("no patches/llama.cpp queue here")
        return 2
    if not target.is_file():
        say(f"error: no sdist at {target} (a llama_cpp_python-VERSION.tar.gz)")
        return 2
    with tempfile.TemporaryDirectory(prefix="specchat-rebase-") as tmp:
        try:
            commit, results = patchqueue.rebase(target, queue, pinned_sdist(say=say), Path(tmp), write=write)
        except (BuildError, OSError, RuntimeError, ValueError, tarfile.TarError) as exc:
            say(f"error: {exc}")
            return 2
    vendors = f" (llama.cpp {commit})" if commit else ""
    say(f"the patch queue on {target.name}{vendors}, three ways where a patch does not fit as it is:")
    for result in results:
        say(f"  {result.line()}")
    failed = [r for r in results if r.status == patchqueue.FAILED]
    clean = sum(r.status == patchqueue.CLEAN for r in results)
    say(
        f"{len(results) - len(failed)} of {len(results)} patches apply ({clean} clean, "
        f"{len(results) - len(failed) - clean} merged three ways, {len(failed)} failed)"
        + (
            f"; the rebased patches are in {write}"
            if write is not None and len(failed) < len(results)
            else ""
        )
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specchat.llama.build install [--force] | check | version | rebase (--sdist PATH |
    --version X) [--write DIR]`."""
    about = f"the pinned {PACKAGE} {PINNED} with specchat's llama.cpp patch queue (patches/llama.cpp)"
    parser = argparse.ArgumentParser(prog="python -m specchat.llama.build", description=about)
    sub = parser.add_subparsers(dest="command")
    inst = sub.add_parser("install", help="build (or take from the cache) and install the patched wheel")
    inst.add_argument("--force", action="store_true", help="reinstall even if this build is installed")
    sub.add_parser("check", help=f"does the whole queue apply to the pinned {PACKAGE} {PINNED}?")
    sub.add_parser("version", help="the local version the patched wheel carries")
    reb = sub.add_parser("rebase", help=f"try the queue on another {PACKAGE} release, three ways")
    which = reb.add_mutually_exclusive_group(required=True)
    which.add_argument("--sdist", type=Path, help="a llama_cpp_python-VERSION.tar.gz")
    which.add_argument("--version", help=f"a {PACKAGE} version to download from the package index")
    reb.add_argument("--write", type=Path, help="a folder for the patches as they applied there")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv) or ["install"])
    if args.command == "install":
        return install(force=args.force)
    if args.command == "check":
        return rebase_report(pinned_sdist())
    if args.command == "version":  # what a build on this machine with these CMAKE_ARGS holds
        cmake_args = build_args(os.environ.get("CMAKE_ARGS", ""))
        print(local_version(PINNED, _selections(patch_queue(), cmake_args)[0]))
        return 0
    try:
        target = args.sdist or fetch_sdist(args.version)
    except BuildError as exc:
        print(f"error: {exc}")
        return 2
    return rebase_report(target, write=args.write)


if __name__ == "__main__":
    sys.exit(main())
