"""One-token decoding per weight type: specchat's plain decoding against llama.cpp's on one model.

Not a test (pytest does not collect it). Writes a 12-layer x 1,024-wide qwen2 model with random
weights (F32, with the `gguf` package), quantises it with llama.cpp's own `llama-quantize` to each
weight type, then times plain greedy decoding of every file side by side, interleaved (repeat 1 of
every configuration, then repeat 2, ...), so a slow spell of the machine hits all of them alike:

  server   llama.cpp's `llama-server`, plain (`/completion`, its own `predicted_per_second`)
  specchat `specchat run FILE --no-draft --json` (its `tokens_per_second`), the patched library
  specchat-other  with --other-python PY: the same, with PY's environment (another build of the queue)
  lowlevel with --lowlevel: llama_cpp's low-level API in a loop (one llama_decode and one argmax per
           token): what the library costs without specchat's loop
  bench    with --bench: `llama-bench -p 0 -n N -t 2` once with the reference build and, with
           --patched-lib DIR, once with DIR (a build of the patched queue's libggml-cpu.so) in front
           of it on LD_LIBRARY_PATH: the kernels alone, no Python

Prints one line per type and configuration: the median tok/s and its ratio to llama-server's.

Usage:
  python tests/perf/onetoken_types.py LLAMA_BIN_DIR [--types F16,BF16,Q8_0,Q4_K_M] [-n 128]
      [--repeats 2] [--dir ~/.cache/specchat-dev/onetoken] [--lowlevel] [--other-python PY] [--bench]
      [--patched-lib DIR] [--no-run]
LLAMA_BIN_DIR holds llama-quantize, llama-server and llama-bench (a stock build of the tree
llama-cpp-python vendors). The model files are written once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.tiny_models import BIAS_LANE, BIAS_LANE_OUT, add_gpt2_tokenizer  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, VOCAB = 1024, 12, 16, 2, 2816, 32000
PROMPT = "def fibonacci(n: int) -> int:\n"


def write_f32(path: Path, *, seed: int = 0) -> Path:
    """The 12 x 1,024 qwen2 model in F32; end-of-generation tokens get a large negative logit bias
    (through residual lane 0, which no layer writes), so both programs decode the full N tokens."""
    rng = np.random.default_rng(seed)
    head_dim = N_EMBD // N_HEAD
    kv = N_HEAD_KV * head_dim

    def lin(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * (gain / np.sqrt(n_in))).astype(
            np.float32
        )

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("onetoken-12x1024")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    types, ids = add_gpt2_tokenizer(w, VOCAB)
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_eot_token_id(ids["eot"])
    w.add_pad_token_id(ids["pad"])
    bias = np.zeros(VOCAB, np.float32)
    bias[[i for i, t in enumerate(types) if t != int(gguf.TokenType.NORMAL)]] = -30.0 / BIAS_LANE_OUT
    embd = rng.standard_normal((VOCAB, N_EMBD), dtype=np.float32)
    embd[:, 0] = BIAS_LANE
    w.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        for name, n_out, gain in (("attn_q", N_EMBD, 2.0), ("attn_k", kv, 2.0), ("attn_v", kv, 1.0)):
            w.add_tensor(p + name + ".weight", lin(n_out, N_EMBD, gain))
            w.add_tensor(p + name + ".bias", (0.02 * rng.standard_normal(n_out)).astype(np.float32))
        out = lin(N_EMBD, N_EMBD)
        out[0] = 0.0
        w.add_tensor(p + "attn_output.weight", out)
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", lin(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", lin(N_FF, N_EMBD))
        down = lin(N_EMBD, N_FF)
        down[0] = 0.0
        w.add_tensor(p + "ffn_down.weight", down)
    on = norm(N_EMBD)
    on[0] = 1.0
    w.add_tensor("output_norm.weight", on)
    head = lin(VOCAB, N_EMBD, 6.0)
    head[:, 0] = bias
    w.add_tensor("output.weight", head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def model_files(bin_dir: Path, out_dir: Path, types: list[str]) -> dict[str, Path]:
    """The F32 model and one llama-quantize'd file per type (written once, reused)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f32 = out_dir / "onetoken-F32.gguf"
    if not f32.exists():
        write_f32(f32.with_suffix(".part"))
        f32.with_suffix(".part").rename(f32)
    files = {}
    for ty in types:
        dest = out_dir / f"onetoken-{ty}.gguf"
        if ty == "F32":
            dest = f32
        elif not dest.exists():
            cmd = [str(bin_dir / "llama-quantize"), str(f32), str(dest) + ".part", ty, "2"]
            subprocess.run(cmd, check=True, capture_output=True)
            Path(str(dest) + ".part").rename(dest)
        files[ty] = dest
    return files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_server(bin_dir: Path, model: Path, n: int) -> float:
    """llama-server's own decode rate (predicted_per_second) for one plain greedy completion."""
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", str(model), "-t", "2", "-tb", "2", "-c", "2048"]
    cmd += ["--port", str(port), "--host", "127.0.0.1", "-np", "1", "--no-warmup"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False}
        req = urllib.request.Request(
            base + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            timings = json.load(r)["timings"]
        if timings["predicted_n"] != n:
            raise SystemExit(f"llama-server decoded {timings['predicted_n']} tokens, not {n}")
        return float(timings["predicted_per_second"])
    finally:
        proc.terminate()
        proc.wait()


def run_specchat(model: Path, n: int, python: str = sys.executable) -> float:
    """`specchat run --no-draft`'s decode rate for the same prompt and token count (this checkout's
    specchat, run by `python`: its environment's llama-cpp-python build)."""
    cmd = [python, "-m", "specchat", "run", str(model), "--no-draft", "--raw", "--temp", "0"]
    cmd += ["-n", str(n), "--json", "-t", "2", "-c", "2048", "-p", PROMPT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return float(json.loads(out.stdout)["stats"]["tokens_per_second"])


def lowlevel_rate(model: Path, n: int) -> float:
    """The floor under specchat's loop: llama_cpp's low-level API in this process, one llama_decode
    and one numpy argmax per token (threads 2, context 2048, as the other configurations run)."""
    import llama_cpp  # only this configuration needs the library in-process

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    lm = llama_cpp.llama_model_load_from_file(str(model).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_threads, cparams.n_threads_batch = 2048, 2, 2
    ctx = llama_cpp.llama_init_from_model(lm, cparams)
    vocab = llama_cpp.llama_model_get_vocab(lm)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = (llama_cpp.llama_token * 256)()
    n_prompt = llama_cpp.llama_tokenize(vocab, PROMPT.encode(), len(PROMPT), buf, 256, False, True)
    batch = llama_cpp.llama_batch_init(256, 0, 1)

    def step(tokens: list[int], pos: int) -> int:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(1, n_vocab))
        return int(logits[0].argmax())

    token = step(list(buf[:n_prompt]), 0)
    start = time.perf_counter()
    for i in range(n):
        token = step([token], n_prompt + i)
    return n / (time.perf_counter() - start)


def run_lowlevel(model: Path, n: int) -> float:
    """lowlevel_rate in a fresh process, as every other configuration runs."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--lowlevel-child", str(model), str(n)]
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1])


def run_bench(bin_dir: Path, model: Path, n: int, lib: Path | None) -> float:
    """llama-bench's tg rate (-p 0 -n N -t 2, one repetition); `lib` goes first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    if lib is not None:
        env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(n), "-t", "2"]
    cmd += ["-r", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("--types", default="F16,BF16,Q8_0,Q4_K_M")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache/specchat-dev/onetoken")
    ap.add_argument("--bench", action="store_true", help="also llama-bench, stock (and --patched-lib)")
    ap.add_argument("--patched-lib", type=Path, help="a folder holding a patched libggml-cpu.so")
    ap.add_argument("--no-run", action="store_true", help="no server/specchat runs (with --bench)")
    ap.add_argument("--lowlevel", action="store_true", help="also a minimal llama_cpp decode loop")
    ap.add_argument("--other-python", help="also specchat with this interpreter's llama-cpp-python build")
    if sys.argv[1:2] == ["--lowlevel-child"]:  # run_lowlevel's child: MODEL N
        print(f"{lowlevel_rate(Path(sys.argv[2]), int(sys.argv[3])):.3f}")
        return
    a = ap.parse_args()
    files = model_files(a.bin_dir, a.dir.expanduser(), a.types.split(","))
    configs: dict[str, object] = {}
    if not a.no_run:
        configs["server"] = lambda m: run_server(a.bin_dir, m, a.n)
        configs["specchat"] = lambda m: run_specchat(m, a.n)
    if a.other_python:
        configs["specchat-other"] = lambda m: run_specchat(m, a.n, a.other_python)
    if a.lowlevel:
        configs["lowlevel"] = lambda m: run_lowlevel(m, a.n)
    if a.bench:
        configs["bench-stock"] = lambda m: run_bench(a.bin_dir, m, a.n, None)
        if a.patched_lib:
            configs["bench-patched"] = lambda m: run_bench(a.bin_dir, m, a.n, a.patched_lib)
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.repeats):
        for ty, path in files.items():
            for name, fn in configs.items():
                res.setdefault((ty, name), []).append(fn(path))  # type: ignore[operator]
    base_name = "server" if "server" in configs else "bench-stock"
    for ty in files:
        base = statistics.median(res[(ty, base_name)])
        for name in configs:
            v = res[(ty, name)]
            med = statistics.median(v)
            runs = ", ".join(f"{x:.1f}" for x in v)
            print(f"{ty:7s} {name:14s} median {med:7.2f} tok/s  x{med / base:.3f} of {base_name}  [{runs}]")


if __name__ == "__main__":
    main()
