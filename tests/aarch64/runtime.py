"""An aarch64 CPython that runs specchat's llama.cpp side under qemu-aarch64: Debian's arm64 python3.11
and the C libraries it and the cross-built llama.cpp need, unpacked into a sysroot, plus a site folder
with numpy and psutil (PyPI's aarch64 wheels), llama-cpp-python's Python package from the pinned sdist
with the cross-built libraries in its lib/, and the few pure-Python packages llama_cpp imports, copied
from the host's environment.

Why not a whole arm64 environment: llama-cpp-python is ctypes over shared libraries, so its Python
side is the same on every CPU; only what is compiled (CPython, numpy, psutil, llama.cpp) has to be
aarch64. Everything is fetched with the ordinary clients (`apt-get download` against a private arm64
package list, `pip download --platform`) into a cache outside the checkout, once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from specchat.llama import build

from .cross_build import cache_root

#: Debian arm64 packages of the sysroot: CPython 3.11 and the shared libraries it and libllama load
DEBS = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "libgomp1",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libssl3",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libsqlite3-0",
)
PYTHON_VERSION = "3.11"
#: compiled packages from PyPI as aarch64 wheels, at the host's versions
WHEELS = ("numpy", "psutil")
#: pure-Python packages llama_cpp and specchat's engine import, copied from the host environment
PURE = ("jinja2", "markupsafe", "diskcache", "typing_extensions", "pytest", "_pytest", "pluggy", "iniconfig",
        "packaging", "pygments", "py")  # fmt: skip
#: the qemu CPU: every extension (dotprod, i8mm, SVE, fp16, bf16)
QEMU_CPU = "max"

Say = Callable[[str], None]


class RuntimeSetupError(RuntimeError):
    """One line saying what could not be fetched or unpacked."""


def _apt_options(state: Path) -> list[str]:
    """apt options for a private arm64 package list: the host's own apt state is never touched."""
    return [
        "-oAPT::Architecture=arm64",
        "-oAPT::Architectures=arm64",
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::Cache={state / 'cache'}",
        "-oDir::State::Status=/dev/null",
        "-oDebug::NoLocking=1",
    ]


def sysroot(*, say: Say = print) -> Path:
    """The arm64 sysroot with CPython 3.11 (cached: `cache_root()/sysroot`)."""
    root = cache_root() / "sysroot"
    stamp = root / ".complete"
    want = "\n".join(DEBS)
    if stamp.is_file() and stamp.read_text() == want:
        return root
    state = cache_root() / "apt-arm64"
    debs = cache_root() / "debs"
    for sub in (state / "lists" / "partial", state / "cache" / "archives" / "partial", debs):
        sub.mkdir(parents=True, exist_ok=True)
    say("fetching Debian's arm64 CPython and C libraries (apt-get download, once)")
    opts = _apt_options(state)
    steps = (["apt-get", *opts, "-qq", "update"], ["apt-get", *opts, "-qq", "download", *DEBS])
    for argv in steps:
        done = subprocess.run(argv, cwd=debs, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeSetupError(
                f"`apt-get {argv[-1] if argv[-1] == 'update' else 'download'}` failed: {why}"
            )
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name in DEBS:
        found = sorted(debs.glob(f"{name}_*_arm64.deb"))
        if not found:
            raise RuntimeSetupError(f"apt-get did not download {name}:arm64")
        subprocess.run(["dpkg", "-x", str(found[-1]), str(root)], check=True)
    stamp.write_text(want)
    return root


def _host_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _wheel(package: str, folder: Path, *, say: Say) -> Path:
    """PyPI's aarch64 CPython 3.11 wheel of `package`, at the host's version where it has one."""
    version = _host_version(package)
    spec = f"{package}=={version}" if version else package
    pattern = f"{package}-{version or '*'}-*aarch64*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[-1]
    say(f"downloading the aarch64 wheel of {spec}")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(folder),
    ]
    for tag in ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"):
        argv += ["--platform", tag]
    argv += ["--python-version", PYTHON_VERSION, "--implementation", "cp", spec]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = sorted(folder.glob(pattern))
    if done.returncode != 0 or not found:
        why = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise RuntimeSetupError(f"could not download an aarch64 wheel of {spec}: {why}")
    return found[-1]


def _copy_pure(name: str, site: Path) -> None:
    """Copy a pure-Python package (or module) of the host's environment into `site`."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeSetupError(f"{name} is not installed here: install specchat's dev extras (make install)")
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        shutil.copytree(origin.parent, site / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    else:
        shutil.copy2(origin, site / origin.name)


def _site_key(libs: Path) -> str:
    parts = [str(libs), *(f"{p}={_host_version(p)}" for p in WHEELS), *PURE]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def site_packages(libs: Path, *, say: Say = print) -> Path:
    """The aarch64 site folder for one cross build (cached: `cache_root()/site/<key>`): numpy and psutil
    wheels, the pure packages, and llama_cpp from the pinned sdist with `libs` in llama_cpp/lib."""
    site = cache_root() / "site" / _site_key(libs)
    if (site / ".complete").is_file():
        return site
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for package in WHEELS:
        with zipfile.ZipFile(_wheel(package, wheels, say=say)) as whl:
            whl.extractall(site)
    for name in PURE:
        _copy_pure(name, site)
    sdist = build.fetch_sdist(build.PINNED, say=say)
    prefix = f"llama_cpp_python-{build.PINNED}/llama_cpp/"
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(prefix) and member.name.endswith(".py"):
                target = site / "llama_cpp" / member.name[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file member
                target.write_bytes(source.read())
    shutil.copytree(libs, site / "llama_cpp" / "lib", symlinks=True)
    (site / ".complete").write_text(str(libs))
    return site


def qemu_command(
    root: Path,
    site: Path,
    argv: Sequence[str],
    *,
    vector_bytes: int | None = None,
    extra_path: Sequence[Path] = (),
) -> list[str]:
    """The command line that runs `python3.11 argv...` under qemu-aarch64 with this runtime.

    `vector_bytes` sets the SVE vector length the emulated CPU reports (16: 128-bit, as Neoverse V2 /
    Graviton4; 32: 256-bit, as Neoverse V1 / Graviton3; qemu's own default is 64)."""
    cpu = QEMU_CPU if vector_bytes is None else f"{QEMU_CPU},sve-default-vector-length={vector_bytes}"
    path = os.pathsep.join(str(p) for p in (site, *extra_path))
    return [
        "qemu-aarch64", "-cpu", cpu, "-L", str(root),
        "-E", f"PYTHONPATH={path}", "-E", "PYTHONDONTWRITEBYTECODE=1",
        str(root / "usr" / "bin" / f"python{PYTHON_VERSION}"), *argv,
    ]  # fmt: skip
