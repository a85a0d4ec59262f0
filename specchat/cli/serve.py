"""`specchat serve`: the speculative engine behind an OpenAI-compatible HTTP API (see `server/`).

Models are found, fit-checked and loaded exactly as for `run`; then the main thread, which loaded them,
generates (every llama.cpp call on one thread: see server/worker.py), uvicorn serves HTTP in a thread
of its own, and a third waits for Ctrl-C / SIGTERM to stop both in order: stop accepting, end the
current answer, free the models, exit 0.
"""

from __future__ import annotations

import json
import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..decoding.settings import CTX_SIZE, SamplingParams
from ..errors import BadInput
from .common import check_range, check_vocab, err_console, guarded, load_models
from .options import (
    DEFAULT_SAMPLING,
    CtxOpt,
    DraftGpuOpt,
    DraftOpt,
    DraftWindowOpt,
    ForceOpt,
    GpuOpt,
    KOpt,
    NoDraftOpt,
    OfflineOpt,
    Options,
    PMinOpt,
    RpcOpt,
    SeedOpt,
    ServeTemplateKwargsOpt,
    StrictOpt,
    TargetArg,
    TemplateKwargOpt,
    ThreadsOpt,
    VerboseOpt,
    parse_k,
    parse_template_kwargs,
    sampling_options,
)

if TYPE_CHECKING:
    from ..decoding.prompt_cache import PromptCache
    from ..models.loader import LoadConfig, Loaded, LoadedEngine
    from ..server.app import ServerThread
    from ..server.guard import HostPolicy
    from ..server.worker import Worker

DEFAULT_PORT = 8080
MIB = 1 << 20
AUTH_EXAMPLE = "Authorization: Bearer $SPECCHAT_API_KEY"


def register(app: typer.Typer) -> None:
    """Add `serve` to the app (called by cli.py)."""
    app.command("serve")(serve)


@guarded
@sampling_options(for_requests=True)
def serve(
    target: TargetArg,
    draft: DraftOpt = None,
    no_draft: NoDraftOpt = False,
    k: KOpt = "auto",
    p_min: PMinOpt = None,
    draft_window: DraftWindowOpt = None,
    sampling: SamplingParams = DEFAULT_SAMPLING,  # one option per setting (sampling_options)
    seed: SeedOpt = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            "-n",
            help="Token limit for requests that send no max_tokens (default: until the context is full).",
            show_default=False,
        ),
    ] = None,
    ctx_size: CtxOpt = CTX_SIZE,
    gpu_layers: GpuOpt = None,
    draft_gpu_layers: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = None,
    system: Annotated[
        str | None, typer.Option("--system", help="System prompt for chat requests that send none.")
    ] = None,
    chat_template_kwargs: ServeTemplateKwargsOpt = None,
    chat_template_kwarg: TemplateKwargOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface; use --api-key).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0 = any free one).")] = DEFAULT_PORT,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="SPECCHAT_API_KEY",
            help="Require `Authorization: Bearer KEY` on every request (but /health).",
            show_default=False,
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="Another Host name to answer to (a LAN name, a reverse proxy's public name; *.lan for a "
            "domain, * for any); repeatable. Requests naming any other host get 403: a web page cannot "
            "reach the server by re-pointing its own name at this machine (DNS rebinding).",
            show_default=False,
        ),
    ] = None,
    max_body: Annotated[
        int | None,
        typer.Option(
            "--max-body",
            metavar="MIB",
            help="Largest request body; larger ones get 413 before they are read. "
            "Default: one that holds the whole context window.",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        int, typer.Option("--queue", help="Requests that may wait while one generates; more get HTTP 503.")
    ] = 8,
    cache_ram: Annotated[
        int | None,
        typer.Option(
            "--cache-ram",
            metavar="MIB",
            help="Host memory for the prompt cache: conversations put aside between requests and "
            "restored when they come back (the target's K/V; a draft model's copies add its share). "
            "Default: a quarter of the free RAM, at most 8192. 0 turns it off.",
            show_default=False,
        ),
    ] = None,
    offline: OfflineOpt = False,
    force: ForceOpt = False,
    strict: StrictOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions) with speculative decoding.

    Point any OpenAI client at http://HOST:PORT/v1, or a browser at http://HOST:PORT/ (a chat page
    that colours tokens by source). Each request reuses the KV cache for the prompt prefix it shares
    with the last one, so a resent conversation decodes only its new tokens, and conversations put
    aside are kept in host memory (--cache-ram) and restored when they come back. Responses carry `usage`
    and a `speculative` object; stream chunks say each token's source.

    Examples:

      specchat serve qwen2.5-coder-1.5b

      specchat serve ./target.gguf --draft ngram --port 8000 --api-key secret

      specchat serve qwen2.5-coder-1.5b --host 0.0.0.0 --allowed-host studio.lan --api-key secret
    """
    opts = Options(
        target, drafts=tuple(draft or ()), no_draft=no_draft, k=parse_k(k), p_min=p_min, params=sampling,
        seed=seed, max_tokens=max_tokens if max_tokens is not None else ctx_size,
        ctx_size=ctx_size, gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=rpc, threads=threads,
        system=system, offline=offline, force=force, strict=strict, verbose=verbose,
        template_kwargs=parse_template_kwargs(chat_template_kwargs, chat_template_kwarg),
        draft_window=draft_window,
    )  # fmt: skip
    check_range("--port", port, 0, 65535)
    check_range("--queue", queue, 0, 10_000)
    if cache_ram is not None:
        check_range("--cache-ram", cache_ram, 0, 1 << 30)
    if max_body is not None:
        check_range("--max-body", max_body, 1, 1 << 20)
    from ..server.guard import parse_allowed

    allowed = parse_allowed(allowed_host or ())
    if api_key is not None and not api_key.strip():
        raise BadInput("--api-key is empty", "give a non-empty key, or leave --api-key out")
    from ..server.app import bind, is_loopback

    err = err_console()
    if not is_loopback(host) and api_key is None:
        err.print(
            f"[yellow]warning:[/] listening on {escape(host)} without --api-key: anyone who can reach "
            "this machine can use the models",
            soft_wrap=True,
        )
    sock = bind(host, port)  # before the slow load: a port in use is reported at once
    try:
        drafts = opts.drafts_to_load(
            announce=lambda line: err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
        )
        cfg = opts.load_config(drafts)
        models = _Models(load_models(cfg, err), cfg, seed=opts.seed, cache_ram=cache_ram, err=err)
        try:
            check_vocab(opts.params, models.loaded.target.n_vocab)  # the requests' default --logit-bias
            guard = Guard(host, allowed, max_body * MIB if max_body is not None else None)
            _serve_loaded(models, opts, sock, guard=guard, api_key=api_key, queue=queue, err=err)
        finally:
            models.close()
    finally:
        sock.close()


@dataclass(slots=True)
class _Models:
    """The models `serve` holds. A target split over RPC workers loses the layers a worker held when
    that worker dies, so `revive` (the server worker's, see server/worker.py) loads them all again
    once every worker answers the probe: asked first, so nothing is closed while one is still gone."""

    loaded: Loaded
    cfg: LoadConfig
    seed: int | None
    cache_ram: int | None
    err: Console

    def engine(self) -> tuple[LoadedEngine, PromptCache]:
        """The backend the server worker runs on, and a prompt cache over its models."""
        from ..decoding.prompt_cache import PromptCache
        from ..models.loader import LoadedEngine

        loaded = self.loaded
        cache = PromptCache(loaded.target, loaded.draft_models, budget_bytes=cache_bytes(self.cache_ram))
        return LoadedEngine(loaded, seed=self.seed), cache

    def revive(self) -> tuple[LoadedEngine, PromptCache]:
        """Every RPC worker answering again: the models loaded anew (WorkerError, and nothing
        closed, while one does not answer)."""
        from ..llama.rpc import build_tag
        from ..llama.rpc_wire import parse_endpoints, probe

        tag = None if self.cfg.force else build_tag()
        for endpoint in parse_endpoints(",".join(self.cfg.rpc)):
            probe(endpoint, timeout=REVIVE_PROBE_SECONDS, build_tag=tag)
        self.err.print("[dim]every RPC worker answers again: loading the models anew…[/]", highlight=False)
        self.loaded.close()  # frees the lost worker's buffers: ggml-rpc then connects anew
        self.loaded = load_models(self.cfg, self.err, quiet=True)
        return self.engine()

    def close(self) -> None:
        self.loaded.close()


#: How long `serve` waits for a lost RPC worker's answer when asking whether it is back.
REVIVE_PROBE_SECONDS = 2.0


def _serve_loaded(
    models: _Models,
    opts: Options,
    sock: object,
    *,
    guard: Guard,
    api_key: str | None,
    queue: int,
    err: Console,
) -> None:
    """Serve until a signal; the models stay open until both threads have stopped using them."""
    from ..server.api import Defaults
    from ..server.app import ServerThread, create_app
    from ..server.worker import Worker

    loaded = models.loaded
    for w in loaded.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    with err.status("preparing the cost model…"):
        backend, cache = models.engine()
        worker = Worker(
            backend,
            k=opts.k,
            p_min=opts.p_min,
            seed=opts.seed,
            queue_size=queue,
            log=lambda line: err.print(f"[dim]{escape(line)}[/]", highlight=False, soft_wrap=True),
            cache=cache,
            revive=models.revive if models.cfg.rpc else None,
        )
    model = model_id(opts.target, loaded.target.path)
    drafts = [d.name for d in loaded.drafters]
    app = create_app(
        worker,
        model=model,
        defaults=Defaults(
            max_tokens=opts.max_tokens,
            params=opts.params,
            seed=opts.seed,
            system=opts.system,
            template_kwargs=opts.template_kwargs,
        ),
        api_key=api_key,
        info={
            "specchat": {"target": str(loaded.target.path), "drafts": drafts, "n_ctx": loaded.target.n_ctx}
        },
        policy=guard.policy(),
        max_body=guard.max_body,
    )
    http = ServerThread(app, sock)  # type: ignore[arg-type]
    with _stop_requested(http) as stop:
        http.start()
        for line in banner(
            base_url(guard.host, http.port),
            model,
            target=str(loaded.target.path),
            drafts=drafts,
            k=opts.k,
            n_ctx=loaded.target.n_ctx,
            api_key=api_key is not None,
        ):
            err.print(line, highlight=False, soft_wrap=True)
        watcher = threading.Thread(
            target=_stop_when_asked, args=(stop, http, worker, err), name="specchat-stop", daemon=True
        )
        watcher.start()
        try:
            # generation runs here, on the thread that loaded and calibrated the models: one thread
            # for every llama.cpp call (why: server/worker.py)
            worker.run()
        finally:
            stop.set()
            worker.shutdown()
            watcher.join()  # the models are freed after this, never while a generation uses them
    err.print("[dim]stopped[/]")


def _stop_when_asked(stop: threading.Event, http: ServerThread, worker: Worker, err: Console) -> None:
    """Wait for a signal (or an HTTP server that died), then stop in order: no new requests, end the
    current answer (the worker's `run` returns after it), close the socket."""
    while not stop.wait(0.5):
        if not http.alive():
            err.print("[red]error:[/] the HTTP server stopped unexpectedly")
            break
    err.print("[dim]stopping: no new requests; ending the current answer…[/]")
    worker.shutdown()
    http.stop()


@contextmanager
def _stop_requested(http: ServerThread) -> Iterator[threading.Event]:
    """An event set by the first Ctrl-C or SIGTERM; a second one forces the HTTP server down."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            http.force_stop()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: The prompt cache's default ceiling (llama-server's --cache-ram default too).
CACHE_RAM_MAX_MIB = 8192


@dataclass(frozen=True, slots=True)
class Guard:
    """What `serve` was told about who may call it: the bound address, the --allowed-host names and
    the --max-body limit in bytes (None: the default for the loaded model's context)."""

    host: str
    allowed: tuple[str, ...] = ()
    max_body: int | None = None

    def policy(self) -> HostPolicy:
        """The Host names served; bound to every interface, this machine's addresses are among them."""
        from ..server.guard import WILDCARDS, HostPolicy, machine_addresses

        local = machine_addresses() if self.host in WILDCARDS else frozenset()
        return HostPolicy(self.host, self.allowed, local)


def cache_bytes(mib: int | None) -> int:
    """--cache-ram in bytes; None: a quarter of the RAM free now, at most CACHE_RAM_MAX_MIB."""
    if mib is not None:
        return mib << 20
    import psutil

    return min(CACHE_RAM_MAX_MIB << 20, psutil.virtual_memory().available // 4)


def model_id(spec: str, path: Path) -> str:
    """The id clients see (and send back as `model`): a registry alias as given, else the file's stem."""
    if "/" in spec or "\\" in spec or spec.endswith(".gguf") or spec.startswith("hf:"):
        return path.stem
    return spec


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for `host`."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/v1"


def banner(
    url: str,
    model: str,
    *,
    target: str,
    drafts: list[str],
    k: int | None,
    n_ctx: int,
    api_key: bool,
) -> list[str]:
    """What startup prints (Rich markup): where, what, and a client call to copy."""
    drafting = f"drafts {', '.join(drafts)} (k {'auto' if k is None else k})" if drafts else "no draft"
    body = {"model": model, "messages": [{"role": "user", "content": "Write hello world in Python"}]}
    curl = ["curl", f"{url}/chat/completions", "-H", "Content-Type: application/json"]
    if api_key:
        curl += ["-H", AUTH_EXAMPLE]
    curl += ["-d", json.dumps(body)]
    key = 'os.environ["SPECCHAT_API_KEY"]' if api_key else '"none"'
    python = (
        f'OpenAI(base_url="{url}", api_key={key}).chat.completions.create(model="{model}", '
        'messages=[{"role": "user", "content": "Write hello world in Python"}])'
    )
    # double quotes, so the shell expands the variable
    curl_line = shlex.join(curl).replace(f"'{AUTH_EXAMPLE}'", f'"{AUTH_EXAMPLE}"')
    return [
        f"[bold]specchat serve[/] · [bold cyan]{escape(url)}[/] (OpenAI-compatible)",
        f"  model [bold]{escape(model)}[/] · {escape(target)} · {escape(drafting)} · context {n_ctx}",
        f"  [dim]page:[/]   {escape(url.removesuffix('/v1'))}/ (a chat in the browser, tokens coloured)",
        f"  [dim]curl:[/]   {escape(curl_line)}",
        f"  [dim]python:[/] from openai import OpenAI; print({escape(python)}.choices[0].message.content)",
        "  [dim]Ctrl-C stops the server.[/]",
    ]
