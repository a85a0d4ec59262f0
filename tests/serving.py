"""The harness of the `specchat serve` tests: a server in-process on 127.0.0.1 (a free port) over a
backend (the tiny GGUF pair, or a fake), the `openai` client pointed at it, and small waits.

Fixtures `tiny_engine` (the tiny pair loaded as `serve` loads it: a draft model and the n-gram
drafter) and `tiny_url` (a server over it) are module-scoped; conftest.py re-exports them.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx
import openai
import pytest

from specchat.decoding.prompt_cache import PromptCache
from specchat.models import loader
from specchat.server.api import Defaults
from specchat.server.app import ServerThread, bind, create_app
from specchat.server.worker import Worker


@contextmanager
def serving(
    backend: object,
    *,
    queue: int = 8,
    api_key: str | None = None,
    k: int | None = 3,
    max_tokens: int = 32,
    cache_bytes: int | None = None,
) -> Iterator[str]:
    """A server on 127.0.0.1 (free port) over `backend`; yields its base URL (…/v1). `cache_bytes`:
    a prompt cache of that size over a LoadedEngine's models (None: none, as before)."""
    cache = None
    if cache_bytes is not None:
        loaded = backend.loaded  # type: ignore[attr-defined]
        cache = PromptCache(loaded.target, loaded.draft_models, budget_bytes=cache_bytes)
    worker = Worker(backend, k=k, queue_size=queue, cache=cache)  # type: ignore[arg-type]
    app = create_app(worker, model="tiny", defaults=Defaults(max_tokens=max_tokens), api_key=api_key)
    http = ServerThread(app, bind("127.0.0.1", 0), graceful_seconds=2)
    worker.start()
    http.start()
    try:
        yield f"http://127.0.0.1:{http.port}/v1"
    finally:
        worker.shutdown()
        http.stop(timeout=10)
        assert worker.join(timeout=10), "the generation thread did not stop"


T = TypeVar("T")


def serve_here(
    backend: object,
    drive: Callable[[str], T],
    *,
    k: int | None = None,
    model: str = "tiny",
    timeout: float = 900,
) -> T:
    """`drive(url)` in a helper thread while this thread generates, as `specchat serve` runs: every
    llama.cpp call on the thread that loaded the models (server/worker.py: a second generating thread
    costs a CPU ~12 ms a token), so the figures a test sees are the real ones. Returns drive's value."""
    worker = Worker(backend, k=k)  # type: ignore[arg-type]
    http = ServerThread(
        create_app(worker, model=model, defaults=Defaults(max_tokens=32)), bind("127.0.0.1", 0)
    )
    http.start()
    done: list[T] = []
    failed: list[BaseException] = []

    def body() -> None:
        try:
            done.append(drive(f"http://127.0.0.1:{http.port}/v1"))
        except BaseException as exc:  # handed to the caller's thread below
            failed.append(exc)
        finally:
            worker.shutdown()

    helper = threading.Thread(target=body, name="specchat-test-driver", daemon=True)
    helper.start()
    try:
        worker.run()  # returns once `body` has shut the worker down
    finally:
        worker.shutdown()
        helper.join(timeout)
        http.stop(timeout=10)
    if failed:
        raise failed[0]
    return done[0]


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)


def health(url: str) -> dict[str, object]:
    return httpx.get(url.removesuffix("/v1") + "/health", timeout=5).json()


def wait_until(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@contextmanager
def loaded_engine(
    target: Path, drafts: tuple[str, ...] = (), draft_window: int | None = None
) -> Iterator[loader.LoadedEngine]:
    """`target` (and `drafts`) loaded as `serve` loads them, on one thread with a 512-token context
    (`draft_window`: --draft-window, None for its default)."""
    cfg = loader.LoadConfig(target=str(target), drafts=drafts, ctx_size=512, threads=1)
    if draft_window is not None:
        cfg = dataclasses.replace(cfg, draft_window=draft_window)
    loaded = loader.load(cfg)
    try:
        yield loader.LoadedEngine(loaded)
    finally:
        loaded.close()


@pytest.fixture(scope="module")
def tiny_engine(tiny_pair: tuple[Path, Path]) -> Iterator[loader.LoadedEngine]:
    """The tiny pair loaded as `serve` loads it: a draft model and the n-gram drafter."""
    target, draft = tiny_pair
    with loaded_engine(target, (str(draft), "ngram")) as engine:
        yield engine


@pytest.fixture(scope="module")
def tiny_url(tiny_engine: loader.LoadedEngine) -> Iterator[str]:
    with serving(tiny_engine) as url:
        yield url


def read_banner(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A `specchat serve` subprocess's start-up lines (read from its stderr up to the Ctrl-C line)
    and the base URL (…/v1) they give."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "Ctrl-C" in line:
            break
    banner = "".join(seen)
    found = re.search(r"http://127\.0\.0\.1:\d+/v1", banner)
    assert found, banner
    return banner, found.group()
