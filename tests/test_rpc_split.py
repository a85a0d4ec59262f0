"""A target split over this machine and an RPC worker on 127.0.0.1 (`specchat worker` in a child
process): greedy output equal to the unsplit target's, token for token, with and without drafting.

The split runs are child processes too: llama.cpp's RPC client aborts the whole process when a worker
goes away mid-run, which must not take the test session with it. Skipped, with the reason, where the
installed llama-cpp-python has no RPC backend (a stock wheel; `make install` builds it in)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.llama.rpc_wire import Endpoint

from .rpc_workers import NO_RPC, child_env, free_port, rpc_build, started_worker
from .serving import read_banner

runner = CliRunner()
needs_rpc = pytest.mark.skipif(not rpc_build(), reason=NO_RPC)


@pytest.fixture
def worker() -> Iterator[tuple[Endpoint, subprocess.Popen[str]]]:
    """`specchat worker` on a free port of 127.0.0.1 (rpc_workers.py)."""
    with started_worker() as started:
        yield started


def run_json(*args: str) -> dict:
    argv = [sys.executable, "-m", "specchat", "run", *args, "--json", "--threads", "1", "--ctx-size", "256"]
    res = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@needs_rpc
def test_a_target_split_over_a_worker_answers_as_the_unsplit_target(tiny_models_dir: Path, worker):
    from .tiny_models import write_tiny_llama

    endpoint, _ = worker
    # four layers, so the split has some on each side; a close draft so drafting is accepted often
    target = write_tiny_llama(tiny_models_dir / "split-target.gguf", seed=11, n_layer=4)
    draft = write_tiny_llama(
        tiny_models_dir / "split-draft.gguf", seed=12, n_layer=4, perturb_from=(11, 0.01)
    )
    prompt = ("-p", "Tell me a story about a dragon", "-n", "32")
    plain = run_json(str(target), "--no-draft", *prompt)
    split = run_json(str(target), "--no-draft", "--rpc", str(endpoint), *prompt)
    assert split["tokens"] == plain["tokens"] and split["prompt_tokens"] == plain["prompt_tokens"]
    drafted = run_json(str(target), "--draft", str(draft), "-k", "3", "--rpc", str(endpoint), *prompt)
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["stats"]["accepted"] > 0  # the draft (local) was used, and verified on the split target
    auto = run_json(str(target), "--draft", str(draft), "--draft", "ngram", "--rpc", str(endpoint), *prompt)
    assert auto["tokens"] == plain["tokens"]


@needs_rpc
def test_the_split_is_said_in_one_line_and_the_worker_says_what_it_serves(tiny_target: Path, worker):
    endpoint, proc = worker
    argv = [sys.executable, "-m", "specchat", "run", str(tiny_target), "--no-draft", "-p", "hi", "-n", "4"]
    argv += ["--threads", "1", "--ctx-size", "256", "--rpc", str(endpoint)]
    res = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"target split: layer 0 and the output on this machine, layer 1 on {endpoint}" in res.stderr
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert f"specchat worker on {endpoint}" in out and "CPU" in out and "MiB free" in out
    assert "worker stopped" in out and "Traceback" not in out


@needs_rpc
def test_ctrl_c_stops_a_worker_started_with_sigint_ignored():
    """A shell's background job (`specchat worker &` in a script) starts with SIGINT ignored, which
    Python keeps: the worker takes SIGINT back, so `kill -INT` stops it as it stops `serve`."""
    with started_worker(sigint_ignored=True) as (_, proc):
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "worker stopped" in out and "Traceback" not in out


def test_an_unreachable_worker_is_one_line_before_anything_loads(tiny_target: Path):
    port = free_port()  # nothing listens there
    argv = ["run", str(tiny_target), "--no-draft", "-p", "hi", "--rpc", f"127.0.0.1:{port}"]
    res = runner.invoke(app, argv)
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output
    wanted = f"127.0.0.1:{port} cannot be reached" if rpc_build() else "without"
    assert wanted in lines[0] and "loading" not in res.stderr


@needs_rpc
def test_a_worker_of_another_build_is_one_line_before_anything_loads(tiny_target: Path, worker):
    from specchat.llama.rpc import build_tag

    from .test_rpc_wire import fake_worker, rpc_worker

    tag = build_tag()
    if tag is None:
        pytest.skip("this llama.cpp build cannot tag its workers (patch 0009)")
    endpoint, _ = worker
    from specchat.llama.rpc_wire import probe

    assert probe(endpoint).version[2] == tag  # `specchat worker` answers with this build's tag
    with fake_worker(rpc_worker(version=(7, 0, 0))) as stock:  # as llama.cpp's ggml-rpc-server answers
        res = runner.invoke(app, ["run", str(tiny_target), "--no-draft", "-p", "hi", "--rpc", str(stock)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "another llama.cpp build" in lines[0] and "loading" not in res.stderr


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:0", "a:1,,b:2"])
def test_a_bad_rpc_option_is_one_line(tiny_target: Path, bad: str):
    res = runner.invoke(app, ["run", str(tiny_target), "-p", "hi", "--rpc", bad])
    assert res.exit_code == 2 and "--rpc takes HOST:PORT" in res.stderr


def test_the_python_api_takes_rpc_as_run_does():
    import specchat

    with pytest.raises(ValueError, match="rpc: --rpc takes HOST:PORT"):
        specchat.load("x.gguf", rpc="nohost")
    with pytest.raises(ValueError, match="rpc must be"):
        specchat.load("x.gguf", rpc=[1])


@needs_rpc
def test_a_worker_on_a_port_in_use_or_with_an_unknown_device_is_one_line():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        res = runner.invoke(app, ["worker", "--port", str(port)])
    assert res.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in res.stderr
    res = runner.invoke(app, ["worker", "--device", "NOPE0"])
    assert res.exit_code == 2 and "no device 'NOPE0'" in res.stderr and "CPU" in res.stderr


@needs_rpc
def test_serve_answers_through_the_split_as_the_unsplit_target(tiny_pair: tuple[Path, Path], worker):
    import httpx

    from .serving import loaded_engine, serving

    target, draft = tiny_pair
    endpoint, _ = worker
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    with loaded_engine(target) as engine, serving(engine) as url:  # unsplit, in this process
        plain = httpx.post(url + "/completions", json=body, timeout=120).json()["choices"][0]["text"]
    cmd = [sys.executable, "-m", "specchat", "serve", str(target), "--draft", str(draft), "--draft", "ngram"]
    cmd += ["--rpc", str(endpoint), "--port", "0", "--threads", "1", "--ctx-size", "512"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        banner, url = read_banner(proc)
        assert f"on {endpoint}" in banner  # the split's line
        reply = httpx.post(url + "/completions", json=body, timeout=120).json()
        assert reply["choices"][0]["text"] == plain
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _memory_cap() -> bool:
    from specchat.llama.devices import ggml_lib

    return rpc_build() and hasattr(ggml_lib(), "ggml_backend_rpc_set_server_memory_limit")


@pytest.mark.skipif(not _memory_cap(), reason="this build's ggml-rpc has no memory cap (patch 0007)")
def test_a_worker_lends_the_memory_given_and_the_split_follows_it(tiny_models_dir: Path):
    from specchat.llama.rpc_wire import probe

    from .tiny_models import write_tiny_llama

    target = write_tiny_llama(tiny_models_dir / "mem-target.gguf", seed=11, n_layer=4)
    with started_worker("--mem", "1") as (endpoint, proc):
        info = probe(endpoint)
        assert info.memory == ((1 << 20, 1 << 20),)  # 1 MiB lent: next to this machine's RAM, nothing
        argv = [sys.executable, "-m", "specchat", "run", str(target), "--no-draft", "-p", "hi", "-n", "4"]
        argv += ["--threads", "1", "--ctx-size", "256", "--rpc", str(endpoint)]
        res = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
        assert res.returncode == 0, res.stderr
        # this machine keeps every layer it may: all but the one the workers always get
        assert f"layers 0-2 and the output on this machine, layer 3 on {endpoint}" in res.stderr
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert "1 MiB free of 1 MiB" in out


#: a child process (an RPC failure must not take the test session with it): the model's logits for a
#: 10-token prompt, loaded as specchat loads a target (repacked weights), split over `rpc` when given,
#: its output layer on this machine (the default) or, with "worker", where llama.cpp puts it
_LOGITS = """
import sys
import numpy as np
from specchat.models.loader import LoadConfig, load
path, output, rpc = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
cfg = LoadConfig(target=path, ctx_size=64, threads=1, rpc=rpc, force=True, local_output=output == "local")
loaded = load(cfg)
try:
    logits = loaded.target.decode([1, 5, 9, 77, 100, 200, 31, 42, 8, 250], list(range(10)))
    sys.stdout.write(np.ascontiguousarray(logits, dtype=np.float32).tobytes().hex())
finally:
    loaded.close()
"""


def _logits(path: Path, *rpc: str, output: str = "local") -> bytes:
    argv = [sys.executable, "-c", _LOGITS, str(path), output, *rpc]
    res = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    return bytes.fromhex(res.stdout)


@needs_rpc
def test_repacked_weight_types_on_a_worker_give_the_unsplit_logits_bit_for_bit(tmp_path: Path, worker):
    """The worker keeps the quantised weights its matmuls read in the CPU's repacked layout, as this
    process does (patch 0009): every layer on the worker, the output layer there too or kept here
    (the default, in the buffer the unsplit load gives it), the logits are the same bits. With a tied
    embedding too, whose output is llama.cpp's second copy of token_embd.weight."""
    from specchat.llama.probe_model import write_probe_gguf

    endpoint, _ = worker
    for qtype in ("Q4_0", "Q4_K", "Q6_K", "Q8_0"):
        for tied in (False, True):
            model = write_probe_gguf(tmp_path / f"probe-{qtype}-{tied}.gguf", qtype, seed=3, tied=tied)
            unsplit = _logits(model)
            assert len(unsplit) == 10 * 288 * 4
            assert _logits(model, str(endpoint)) == unsplit, (qtype, tied)
            assert _logits(model, str(endpoint), output="worker") == unsplit, (qtype, tied)


@needs_rpc
def test_a_split_keeps_the_output_layer_here_so_no_logits_cross_the_network(tiny_models_dir: Path, worker):
    """Counted on the wire: with the output layer on this machine a 10-token decode brings back hidden
    states (n_embd floats a row), not logits (n_vocab floats a row); left on the worker, the logits
    come back. The output is the unsplit one either way."""
    from .rpc_workers import counting_relay
    from .tiny_models import write_tiny_llama

    endpoint, _ = worker
    n_vocab, n_embd, rows = 4096, 32, 10
    model = write_tiny_llama(tiny_models_dir / "wide-vocab.gguf", seed=5, vocab=n_vocab, n_embd=n_embd)
    unsplit = _logits(model)
    assert len(unsplit) == rows * n_vocab * 4
    sent_back = {}
    for output in ("local", "worker"):
        with counting_relay(endpoint) as relay:
            assert _logits(model, str(relay.endpoint), output=output) == unsplit, output
            sent_back[output] = relay.from_worker
    logits_bytes = rows * n_vocab * 4
    assert sent_back["worker"] >= logits_bytes  # the logits crossed
    assert sent_back["local"] < logits_bytes // 4  # hidden states (and the protocol's replies) only


@needs_rpc
def test_doctor_lists_the_workers_with_their_memory_and_says_why_one_cannot_be_used(worker):
    endpoint, _ = worker
    gone = Endpoint("127.0.0.1", free_port())
    res = runner.invoke(app, ["doctor", "--offline", "--json", "--rpc", f"{endpoint},{gone}"])
    assert res.exit_code == 0, res.output
    ready, lost = json.loads(res.output)["workers"]
    assert ready["endpoint"] == str(endpoint) and ready["rpc_version"].startswith("7.")
    assert ready["devices"] and 0 < ready["free_bytes"] <= ready["total_bytes"]
    assert lost["endpoint"] == str(gone) and "cannot be reached" in lost["error"]
    table = runner.invoke(app, ["doctor", "--offline", "--rpc", f"{endpoint},{gone}"], env={"COLUMNS": "200"})
    assert "RPC workers" in table.output and "ready" in table.output and "cannot be reached" in table.output
    bad = runner.invoke(app, ["doctor", "--rpc", "nohost"])
    assert bad.exit_code != 0 and "HOST:PORT" in bad.output and "Traceback" not in bad.output
