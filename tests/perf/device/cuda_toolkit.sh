#!/usr/bin/env bash
# Completes a CUDA toolkit assembled from PyPI (nvcc, cudart, cccl: /usr/local/cuda on these machines)
# so that llama.cpp's CUDA backend compiles against it:
#   - cuBLAS (headers and libraries) from the `nvidia-cublas` wheel of the toolkit's major version;
#   - a link-time stub for the driver library (libcuda.so, soname libcuda.so.1), as the full toolkit
#     ships in lib/stubs: every driver entry point named in cuda.h, each answering
#     CUDA_ERROR_NO_DEVICE (100). On a machine with a GPU the driver's own libcuda.so.1 is loaded
#     instead; on one without, putting lib/stubs on LD_LIBRARY_PATH lets a CUDA build load and find
#     no device (how tests/perf/device/cuda_smoke.sh checks specchat on a CUDA build here).
# Usage: bash tests/perf/device/cuda_toolkit.sh [PREFIX]   (default /usr/local/cuda; idempotent)
set -euo pipefail
prefix=${1:-/usr/local/cuda}
nvcc="$prefix/bin/nvcc"
[ -x "$nvcc" ] || { echo "no nvcc at $nvcc: install nvidia-cuda-nvcc (and cudart, cccl) first" >&2; exit 1; }
release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
major=${release%%.*}
lib="$prefix/lib"; [ -d "$prefix/lib64" ] && lib="$prefix/lib64"
inc="$prefix/include"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

if [ ! -e "$inc/cublas_v2.h" ]; then
  # the newest cuBLAS of this toolkit's release (13.0 -> 13.0.x), else of its major version
  spec="nvidia-cublas==${release}.*"; [ "$major" -lt 13 ] && spec="nvidia-cublas-cu${major}==${release}.*"
  echo "cuda_toolkit: fetching $spec" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: "$spec" -d "$work" \
    || python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cublas-cu${major}" -d "$work"
  (cd "$work" && python3 -m zipfile -e ./*.whl unpacked)
  src=$(dirname "$(find "$work/unpacked" -name cublas_v2.h | head -1)")/..
  cp -a "$src"/include/* "$inc"/
  cp -a "$src"/lib/* "$lib"/
  for so in "$lib"/libcublas*.so.* "$lib"/libnvblas.so.*; do
    [ -e "$so" ] && ln -sf "$(basename "$so")" "${so%%.so.*}.so"
  done
fi

if [ ! -e "$lib/stubs/libcuda.so" ]; then
  mkdir -p "$lib/stubs"
  grep -ohE '\bcu[A-Z][A-Za-z0-9_]*\b' "$inc/cuda.h" | sort -u \
    | awk '{ printf "int %s(void) { return 100; }\n", $1 }' > "$work/stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/stubs/libcuda.so" "$work/stub.c"
  ln -sf libcuda.so "$lib/stubs/libcuda.so.1"
fi
echo "cuda_toolkit: $prefix ready (CUDA $release, cuBLAS $(ls "$lib"/libcublas.so.* | head -1 | sed 's/.*\.so\.//'), driver stub in $lib/stubs)"
