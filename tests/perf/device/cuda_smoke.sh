#!/usr/bin/env bash
# specchat on a CUDA build of its patched llama-cpp-python, as far as a machine without a GPU shows it:
# installs WHEEL into a scratch venv beside the checkout's code, loads it with the toolkit's driver
# stub (tests/perf/device/cuda_toolkit.sh: every driver call answers "no device") and runs what a user
# runs first -- the build self-check and invariance probe (`make install`'s last step), `doctor`, and a
# short `run` of a tiny random-weight pair (tests/tiny_models.py) with its default offload.
# Usage: bash tests/perf/device/cuda_smoke.sh WHEEL [CUDA_PREFIX]   (~2 minutes; nothing is installed
# outside $TMPDIR; the checkout's own .venv is not touched)
set -euo pipefail
wheel=$(realpath "$1"); prefix=${2:-/usr/local/cuda}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
lib="$prefix/lib"; [ -d "$prefix/lib64" ] && lib="$prefix/lib64"
[ -e "$lib/stubs/libcuda.so.1" ] || { echo "no driver stub in $lib/stubs: run tests/perf/device/cuda_toolkit.sh" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel" typer rich huggingface-hub psutil gguf pytest
export PYTHONPATH="$repo" SPECCHAT_HOME="$work/home" HF_HUB_OFFLINE=1
export LD_LIBRARY_PATH="$lib/stubs:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py="$work/venv/bin/python"
echo "== the build: llama.cpp's backends and offload support"
"$py" - <<'PY'
import llama_cpp
from specchat.llama.engine import backend_info, supports_gpu_offload
print("llama_cpp", llama_cpp.__version__, "gpu offload:", supports_gpu_offload())
print({k: v for k, v in backend_info().items() if k != "system_info"})
PY
echo "== make install's self-check and invariance probe (python -m specchat.llama.buildcheck install, dry run)"
"$py" -m specchat.llama.buildcheck install --dry-run || echo "(exit $?)"
echo "== specchat doctor"
"$py" -m specchat doctor || echo "(exit $?)"
echo "== specchat run on a tiny random-weight pair (default offload)"
"$py" - "$work" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.tiny_models import write_tiny_llama
d = Path(sys.argv[1])
write_tiny_llama(d / "t.gguf", seed=1)
write_tiny_llama(d / "d.gguf", seed=2, perturb_from=(1, 0.01))
PY
"$py" -m specchat run "$work/t.gguf" --draft "$work/d.gguf" --temp 0 -n 24 -p "hello" --raw
"$py" -m specchat run "$work/t.gguf" --temp 0 -n 24 -p "hello" --raw --no-draft
