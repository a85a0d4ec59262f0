"""llama.cpp with specchat's patch queue, cross-compiled for aarch64 Linux (Debian's gcc cross compilers),
as the shared libraries llama-cpp-python loads: what `make test-aarch64` runs under qemu-aarch64.

Why from build.py's own functions: the emulated check must test exactly the source `make install`
builds -- the pinned sdist with the whole queue applied (`specchat.llama.build.prepare_source`) --
only compiled for another CPU.

Why these flags: `-march` names every ARM extension ggml has kernels for (dotprod, i8mm, SVE, fp16
vector arithmetic), so the repacked i8mm GEMM/GEMV pairs, the 2-row i8mm vec_dots, the SVE vec_dots and
tinyBLAS's fp16 kernel are all compiled in, and which of them a run takes is decided at run time (SVE
vector length included) as on a real ARM server. No native detection (the compiler would ask the x86
host), no all-variants dispatch, no curl, no tests or examples: four libraries, about 2 minutes on 2
cores. `NEON_ARCH` and `DOTPROD_ARCH` leave out SVE, and SVE and i8mm (`ARCHES`).

The build is cached outside the checkout (`cache_root()/libs/<key>`), keyed by everything that changes
the binary: the pinned version, the queue's hash, the -march string and the compiler's version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specchat.llama import build

#: every ARM extension ggml has kernels for; qemu-aarch64's `-cpu max` has them all
SVE_ARCH = "armv8.6-a+dotprod+i8mm+sve+fp16"
#: the same without SVE (Apple M2 and later)
NEON_ARCH = "armv8.6-a+dotprod+i8mm+fp16"
#: dotprod without i8mm or SVE (Neoverse N1 / Graviton2, Ampere Altra, Apple M1): the 8x4 and 4x4
#: repacks, and tinyBLAS (ggml disables it with SVE or i8mm)
DOTPROD_ARCH = "armv8.2-a+dotprod+fp16"
#: `make test-aarch64`'s --arch names
ARCHES = {"sve": SVE_ARCH, "neon": NEON_ARCH, "dotprod": DOTPROD_ARCH}
CC = "aarch64-linux-gnu-gcc"
CXX = "aarch64-linux-gnu-g++"
#: the cross toolchain's sysroot (Debian's libc6-dev-arm64-cross)
CROSS_ROOT = Path("/usr/aarch64-linux-gnu")
#: what llama-cpp-python's ctypes layer loads (libllama pulls in the ggml ones)
LIBRARIES = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")

Say = Callable[[str], None]


class CrossBuildError(RuntimeError):
    """One line saying what failed and where its log is."""


class BuildTimeout(CrossBuildError):
    """The build did not finish in the time it was given (nothing is cached)."""


def cache_root() -> Path:
    """Where the aarch64 build and runtime are kept: $SPECCHAT_AARCH64_CACHE, else next to the wheel
    cache (~/.cache/specchat/aarch64), so a rerun and CI on the same machine reuse them."""
    env = os.environ.get("SPECCHAT_AARCH64_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specchat" / "aarch64"


def toolchain_file(cc: str = CC, cxx: str = CXX, root: Path = CROSS_ROOT) -> str:
    """A CMake toolchain file for aarch64 Linux with Debian's cross compilers."""
    return "\n".join(
        [
            "set(CMAKE_SYSTEM_NAME Linux)",
            "set(CMAKE_SYSTEM_PROCESSOR aarch64)",
            f"set(CMAKE_C_COMPILER {cc})",
            f"set(CMAKE_CXX_COMPILER {cxx})",
            f"set(CMAKE_FIND_ROOT_PATH {root})",
            "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)",
            "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)",
            "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)",
            "",
        ]
    )


def cmake_args(arch: str) -> list[str]:
    """llama.cpp's options for the cross build: explicit -march, shared libraries that find each other
    through $ORIGIN (as the wheel's do), nothing but the libraries."""
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DGGML_NATIVE=OFF",
        f"-DGGML_CPU_ARM_ARCH={arch}",
        "-DGGML_CPU_ALL_VARIANTS=OFF",
        "-DGGML_BACKEND_DL=OFF",
        "-DGGML_OPENMP=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_COMMON=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
    ]


def compiler_version(cxx: str = CXX) -> str:
    """The cross compiler's version line ('' when it is not installed)."""
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return (done.stdout.splitlines() or [""])[0]


def build_key(patches: Sequence[Path], arch: str, compiler: str, version: str = build.PINNED) -> str:
    """Sixteen hex digits naming the binary: version, queue, -march, compiler and the options."""
    parts = [version, build.queue_hash(patches), arch, compiler, *cmake_args(arch)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cached(key: str) -> Path | None:
    """The cached build's library folder, when all its libraries are there."""
    folder = cache_root() / "libs" / key
    return folder if all((folder / name).is_file() for name in LIBRARIES) else None


def _run(argv: Sequence[str], log: Path, *, timeout: float | None = None) -> int:
    """Run one build step with its output appended to `log` (never on the terminal: it is long)."""
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(argv)}\n")
        handle.flush()
        try:
            done = subprocess.run(
                list(argv), stdout=handle, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise BuildTimeout(
                f"the aarch64 build did not finish within {timeout:.0f} s; see {log}"
            ) from None
        return done.returncode


def build_libraries(
    *,
    arch: str = SVE_ARCH,
    patches: Sequence[Path] | None = None,
    jobs: int | None = None,
    timeout: float | None = None,
    say: Say = print,
) -> Path:
    """The cross-built libraries for this queue and -march: from the cache, else built (under nice, as
    a long compile on a shared machine should be) within `timeout` seconds and cached. Returns their
    folder; BuildTimeout when the build ran out of time."""
    patches = build.patch_queue() if patches is None else list(patches)
    compiler = compiler_version()
    if not compiler:
        raise CrossBuildError(f"no {CXX}: install g++-aarch64-linux-gnu (make test-aarch64 does)")
    key = build_key(patches, arch, compiler)
    hit = cached(key)
    if hit is not None:
        say(f"using the cached aarch64 build {key} (-march={arch})")
        return hit
    sdist = build.fetch_sdist(build.PINNED, say=say)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"build-{key}.log"
    log.unlink(missing_ok=True)
    say(f"cross-compiling llama.cpp with {len(patches)} patches for aarch64 (-march={arch}; log: {log})")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specchat-aarch64-") as tmp:
        src = build.prepare_source(sdist, patches, Path(tmp), build.local_version(build.PINNED, patches))
        toolchain = Path(tmp) / "aarch64.cmake"
        toolchain.write_text(toolchain_file())
        out = Path(tmp) / "build"
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(out), *generator]
        configure += [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", *cmake_args(arch)]
        steps = [
            configure,
            [
                *nice,
                "cmake",
                "--build",
                str(out),
                "-j",
                str(jobs or os.cpu_count() or 1),
                "--target",
                "llama",
            ],
        ]
        deadline = None if timeout is None else time.monotonic() + timeout
        for argv in steps:
            left = None if deadline is None else max(1.0, deadline - time.monotonic())
            if _run(argv, log, timeout=left) != 0:
                raise CrossBuildError(f"the aarch64 build failed at `{' '.join(argv[:3])} ...`; see {log}")
        folder = root / "libs" / key
        staging = folder.with_name(key + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in LIBRARIES:
            found = sorted((out / "bin").glob(name + "*"))
            if not found:
                raise CrossBuildError(f"the aarch64 build made no {name}; see {log}")
            # the real file under the plain name and the soname the others ask for (libggml.so.0 ...)
            real = found[-1].resolve()
            shutil.copy2(real, staging / name)
            soname = name + ".0"
            if not (staging / soname).exists():
                (staging / soname).symlink_to(name)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    say(f"built in {time.monotonic() - start:.0f} s")
    return folder
