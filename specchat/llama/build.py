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
which still satisfies `llama-cpp-python>=...` and tells `specchat doctor` which queue it holds.

A plain `pip install specchat` never comes here: it gets stock llama-cpp-python, which works as before
(the invariance probe then reports where its batches part and the planner keeps its tie margin).

Standard library only: it runs in a fresh venv before specchat's dependencies are installed
(`python -m specchat.llama.build install`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: the llama-cpp-python release whose vendored llama.cpp the patch queue is written against
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
    """Ten hex digits naming the queue: its file names and bytes, in order."""
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:10]


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


def apply_patches(llama_dir: Path, patches: Sequence[Path]) -> None:
    """Apply the queue to a vendored llama.cpp tree, checking each patch first; a patch that does not
    apply is named, and nothing after it is applied."""
    # git apply inside a repository applies only paths below the current folder, relative to the
    # repository's root -- and skips the rest with exit status 0. The sdist ships a .git of its own,
    # so stop git from discovering any repository above the tree: it then patches plain files.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(llama_dir.resolve().parent)}
    for patch in patches:
        for check in (True, False):
            argv = ["git", "apply", "--verbose", *(["--check"] if check else []), str(patch)]
            done = subprocess.run(argv, cwd=llama_dir, capture_output=True, text=True, check=False, env=env)
            skipped = [ln for ln in done.stderr.splitlines() if ln.startswith("Skipped patch")]
            if done.returncode != 0 or skipped:
                why = (skipped or done.stderr.strip().splitlines() or ["git apply failed"])[0]
                raise BuildError(f"{patch.name} does not apply to {llama_dir}: {why}")


def prepare_source(sdist: Path, patches: Sequence[Path], workdir: Path, version: str) -> Path:
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
    llama_dir = src / "vendor" / "llama.cpp"
    stale_git = llama_dir / ".git"  # a submodule pointer in the sdist: git apply must not follow it
    if stale_git.is_file():
        stale_git.unlink()
    apply_patches(llama_dir, patches)
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


def build_wheel(*, version: str = PINNED, patches: Sequence[Path] | None = None, cmake_args: str = "",
                python: str = sys.executable, say: Say = _say) -> Path:  # fmt: skip
    """The patched wheel for these inputs: from the cache, else built (and then cached)."""
    patches = patch_queue() if patches is None else list(patches)
    key = build_key(version, patches, cmake_args)
    hit = cached_wheel(key)
    if hit is not None:
        say(f"using the cached patched {PACKAGE} wheel {hit.name}")
        return hit
    sdist = fetch_sdist(version, python=python, say=say)
    out = cache_dir() / "wheels" / key
    log = cache_dir() / "build.log"
    log.unlink(missing_ok=True)  # one build's output per log
    shown = f" CMAKE_ARGS={shlex.quote(cmake_args)}" if cmake_args else ""
    say(
        f"building {PACKAGE} {version} with {len(patches)} llama.cpp patches (about 15 minutes on 2 "
        f"cores, once; log: {log}){shown}"
    )
    with tempfile.TemporaryDirectory(prefix="specchat-llama-build-") as tmp:
        src = prepare_source(sdist, patches, Path(tmp), local_version(version, patches))
        staging = Path(tmp) / "wheel"
        env = {**os.environ, "CMAKE_ARGS": cmake_args}
        argv = [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(staging), str(src)]
        rc = _run_logged(argv, log, env=env, say=say, what="still building")
        built = sorted(staging.glob("llama_cpp_python-*.whl"))
        if rc != 0 or not built:
            raise BuildError(f"building {PACKAGE} failed (exit {rc}); the build log is {log}")
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
    cmake_args = first_build_args(os.environ.get("CMAKE_ARGS", "")) if cmake_args is None else cmake_args
    patches = patch_queue()
    if not patches:
        say("no patches/llama.cpp queue here: keeping the stock llama-cpp-python")
        return 0
    want = local_version(PINNED, patches)
    key = build_key(PINNED, patches, cmake_args)
    if not force and installed_version() == want and (cache_dir() / "wheels" / key).is_dir():
        say(f"{PACKAGE} {want} (patched) is installed")
        return 0
    try:
        wheel = build_wheel(cmake_args=cmake_args, patches=patches, say=say)
        install_wheel(wheel, say=say)
    except BuildError as exc:
        say(f"error: {exc}")
        return 1
    say(f"installed {PACKAGE} {want} (patched: {', '.join(p.name.split('-', 1)[0] for p in patches)})")
    return 0


def check_queue(*, say: Say = _say) -> int:
    """Apply the queue to a scratch copy of the pinned sdist (already downloaded): 0 when it applies."""
    sdist = cache_dir() / "sdist" / f"llama_cpp_python-{PINNED}.tar.gz"
    if not sdist.is_file():
        say(f"no {sdist.name} in {sdist.parent}: run `make install` first")
        return 2
    with tempfile.TemporaryDirectory(prefix="specchat-patch-check-") as tmp:
        try:
            prepare_source(sdist, patch_queue(), Path(tmp), local_version(PINNED, patch_queue()))
        except BuildError as exc:
            say(f"error: {exc}")
            return 1
    say(f"all {len(patch_queue())} patches apply to {PACKAGE} {PINNED}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specchat.llama.build install [--force] | check | version`."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "install"
    if command == "install":
        return install(force="--force" in args[1:])
    if command == "check":
        return check_queue()
    if command == "version":
        print(local_version(PINNED, patch_queue()))
        return 0
    print(f"usage: python -m specchat.llama.build install [--force] | check | version (got {command!r})")
    return 2


if __name__ == "__main__":
    sys.exit(main())
