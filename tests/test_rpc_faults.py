"""A worker that dies while a split target uses it: `run` ends the answer with one line naming the worker
and keeps the text so far, `serve` answers 503 naming it and keeps running (/health answers).

Needs the build's ggml-rpc to fail a lost connection rather than abort (patch 0006 in patches/llama.cpp,
`ggml_backend_rpc_failed`); skipped with the reason elsewhere. Every split runs in a child process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .rpc_workers import NO_RPC, child_env, rpc_build, started_worker
from .serving import read_banner


def _fault_patch() -> bool:
    from specchat.llama.devices import ggml_lib

    return rpc_build() and hasattr(ggml_lib(), "ggml_backend_rpc_failed")


pytestmark = pytest.mark.skipif(
    not _fault_patch(),
    reason=NO_RPC if not rpc_build() else "this build's ggml-rpc aborts on a lost worker (no patch 0006)",
)


def test_a_worker_killed_mid_answer_ends_it_in_one_line_naming_it_and_the_text_is_kept(tiny_models_dir: Path):
    from .tiny_models import write_tiny_llama

    target = write_tiny_llama(tiny_models_dir / "fault-target.gguf", seed=21, n_layer=4, n_ctx_train=4096)
    with started_worker() as (endpoint, worker):
        argv = [sys.executable, "-m", "specchat", "run", str(target), "--no-draft", "-p", "Once upon a time"]
        argv += ["-n", "3500", "--ctx-size", "4096", "--threads", "1", "--rpc", str(endpoint)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        try:
            assert proc.stdout is not None
            first = proc.stdout.read(1)  # the answer has begun
            worker.kill()
            worker.wait()
            rest, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    said = err.decode(errors="replace")
    assert proc.returncode == 1, said
    lines = [ln for ln in said.splitlines() if ln.strip() and not ln.startswith("target split")]
    assert len(lines) == 1 and f"the RPC worker {endpoint} stopped answering" in lines[0], said
    assert "Traceback" not in said and first and len(first + rest) > 1  # what was generated is kept


def test_serve_answers_503_naming_a_lost_worker_and_recovers_when_it_is_back(tiny_target: Path):
    with started_worker() as (endpoint, worker):
        argv = [sys.executable, "-m", "specchat", "serve", str(tiny_target), "--no-draft", "--port", "0"]
        argv += ["--threads", "1", "--ctx-size", "256", "--rpc", str(endpoint)]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            _, url = read_banner(proc)
            body = {"model": "tiny", "prompt": "Once", "max_tokens": 4, "temperature": 0}
            first = httpx.post(url + "/completions", json=body, timeout=120)
            assert first.status_code == 200
            worker.kill()
            worker.wait()
            lost = httpx.post(url + "/completions", json=body, timeout=120)
            assert lost.status_code == 503, lost.text
            assert str(endpoint) in lost.json()["error"]["message"]
            health = httpx.get(url.removesuffix("/v1") + "/health", timeout=30)
            assert health.status_code == 200 and str(endpoint) in health.json()["unavailable"]
            again = httpx.post(url + "/completions", json=body, timeout=120)  # still gone: asked again
            assert again.status_code == 503 and "cannot be reached" in again.json()["error"]["message"]
            with started_worker(port=endpoint.port):  # the same worker started again: served again
                back = httpx.post(url + "/completions", json=body, timeout=120)
                assert back.status_code == 200, back.text
                assert back.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
                assert "unavailable" not in httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
