#!/usr/bin/env bash
# The prepared device check (tests/perf/device/README.md): installs the carried wheels (.whl/*.whl:
# the CUDA llama-cpp-python, gguf, diskcache) into $SITE, puts the CUDA runtime and cuBLAS of this
# python's nvidia packages on LD_LIBRARY_PATH, shows what the CUDA library still misses, then runs
# run_device.py (random-weight 8B + 1B Q4_0, specchat's calibration, the hardware replay).
# Everything printed also goes to $OUT/log.
#
# Usage: bash tests/perf/device/run.sh [run_device.py options, e.g. --dry-run --published]
#   SCRIPT  the script it runs (default run_device.py; verify_rows.py: verify rows against one-token
#           decoding and their cost, see README.md)
#   OUT     where the log, the curve file and the replay table go (default ./device-out)
#   PYTHON  the interpreter (default python3: /opt/torch/.venv/bin/python3 on the GPU machine)
#   SITE    where the carried wheels are installed (default /tmp/site)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
OUT=${OUT:-$PWD/device-out}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" || exit 1

# the folders of this python's nvidia packages that hold the CUDA runtime and cuBLAS (no fixed path:
# nvidia/cu13/lib for CUDA 13's wheels, nvidia/cublas/lib and nvidia/cuda_runtime/lib for older ones)
cuda_lib_dirs() {
  "$PY" - <<'EOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
dirs = []
for root in roots:
    for pattern in ("libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*"):
        for f in sorted(glob.glob(os.path.join(root, "**", pattern), recursive=True)):
            if os.path.dirname(f) not in dirs:
                dirs.append(os.path.dirname(f))
print(":".join(dirs))
EOF
}

main() {
  echo "== $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores; $("$PY" --version 2>&1) ($(command -v "$PY"))"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "== installing into $SITE: $(cd .whl && echo *.whl) ($(du -sh .whl | cut -f1))"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "pip install of the carried wheels failed"; return 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "== no .whl/*.whl: using $PY's own packages"
  fi
  local libs d
  libs=$(cuda_lib_dirs)
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libs="${libs:+$libs:}$d"
  done
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local lib so
  lib=$("$PY" -c 'import importlib.util as u, os; s = u.find_spec("llama_cpp"); print(os.path.join(os.path.dirname(s.origin), "lib") if s else "")')
  echo "== llama_cpp libraries: ${lib:-none found} $(ls "$lib" 2>/dev/null | tr '\n' ' ')"
  for so in "$lib"/libggml-cuda.so*; do
    [ -e "$so" ] || continue
    echo "== ldd $(basename "$so") (CUDA libraries, and anything not found):"
    ldd "$so" | grep -E "not found|cudart|cublas|libcuda\.so"
  done
  "$PY" -u "tests/perf/device/${SCRIPT:-run_device.py}" --out "$OUT" "$@"
}

main "$@" 2>&1 | tee "$OUT/log"
exit "${PIPESTATUS[0]}"
