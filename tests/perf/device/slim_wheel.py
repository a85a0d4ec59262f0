"""Repack a llama-cpp-python wheel with one copy of each library, so that a CUDA build fits what
travels to a GPU machine (64 MiB, tests/perf/device/README.md).

A wheel cannot hold symbolic links, so llama-cpp-python's holds every shared library six times:
lib<x>.so, .so.0 and .so.0.25.3, once in llama_cpp/lib and once more in a top-level lib/ (plus
headers in include/). A CUDA build's libggml-cuda is tens of MB, so six copies do not travel. Kept
here: the Python package, its dist-info (RECORD rewritten), and in llama_cpp/lib the libraries that
llama_cpp opens by name (libllama.so, libggml.so, libmtmd.so, libllava.so) and, transitively, every
file one of them needs by its soname (libggml-cuda.so.0, libggml-base.so.0, ...), as `readelf -d`
reads them. Without readelf every file in llama_cpp/lib is kept (only the top-level copies go).

Usage: python tests/perf/device/slim_wheel.py WHEEL [-o DIR]   (default DIR: .whl)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

#: the libraries llama_cpp's Python code opens with ctypes, by file name (load_shared_library)
OPENED_BY_NAME = ("libllama.so", "libggml.so", "libmtmd.so", "libllava.so")
LIB_DIR = "llama_cpp/lib/"


def needed(path: Path) -> list[str] | None:
    """The DT_NEEDED names of a shared library (None when readelf is not there)."""
    if shutil.which("readelf") is None:
        return None
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=False).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def keep_libraries(lib_dir: Path) -> set[str]:
    """The file names in llama_cpp/lib that are opened by name or needed, transitively."""
    present = {p.name for p in lib_dir.iterdir() if p.is_file()}
    todo = [n for n in OPENED_BY_NAME if n in present]
    keep: set[str] = set()
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        deps = needed(lib_dir / name)
        if deps is None:
            return present
        todo += [d for d in deps if d in present]
    return keep


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, out_dir: Path) -> Path:
    """Write the slimmed wheel (same file name) into out_dir; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name
    if target.resolve() == wheel.resolve():
        raise SystemExit("give an output folder other than the wheel's own")
    with zipfile.ZipFile(wheel) as zin, tempfile.TemporaryDirectory() as tmp:
        names = zin.namelist()
        libs = [n for n in names if n.startswith(LIB_DIR) and n != LIB_DIR]
        for n in libs:
            zin.extract(n, tmp)
        keep_libs = keep_libraries(Path(tmp) / LIB_DIR) if libs else set()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        record_name = f"{dist_info}/RECORD"
        lines = []
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                n = info.filename
                top = n.split("/")[0]
                if n == record_name or n.endswith("/"):
                    continue
                if not (top == "llama_cpp" or top == dist_info):
                    continue  # the top-level lib/, include/, bin/ copies
                if n.startswith(LIB_DIR) and n[len(LIB_DIR) :] not in keep_libs:
                    continue
                data = zin.read(n)
                zout.writestr(info, data)
                lines.append(record_line(n, data))
            lines.append(f"{record_name},,")
            zout.writestr(record_name, "\n".join(lines) + "\n")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=Path(".whl"))
    args = ap.parse_args()
    target = slim(args.wheel, args.out)
    with zipfile.ZipFile(target) as z:
        libs = sorted(n[len(LIB_DIR) :] for n in z.namelist() if n.startswith(LIB_DIR))
    mb = 2**20
    print(f"{target}: {target.stat().st_size / mb:.1f} MiB (was {args.wheel.stat().st_size / mb:.1f} MiB); "
          f"llama_cpp/lib: {' '.join(libs)}")  # fmt: skip


if __name__ == "__main__":
    main()
