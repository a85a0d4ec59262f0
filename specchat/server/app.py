"""The HTTP side: Starlette routes over the worker, the API-key check, server-sent events, uvicorn.

Routes: POST /v1/chat/completions, POST /v1/completions (streamed or not), GET /v1/models, GET
/health, and GET / (the live page, page.py; it needs no key, as it holds none: it asks the user);
the tokenizer's POST /tokenize, POST /detokenize and GET /tokenizer_info (tokens.py; also under /v1/),
which run on the worker as quick jobs, between two rounds of a generation at worst.
Every request first passes guard.py (the Host and Origin a browser sends, a JSON Content-Type, the
body's size), then the API key when the server has one. Every failure a client can cause is JSON in
OpenAI's error shape (400 bad input, 401 wrong key, 403 foreign host or origin, 404 unknown route,
413 body too large, 415 not JSON, 503 busy or stopping); an unexpected one is a 500 with the same
shape, its traceback in the log, and the server keeps running.

The handler waits for the worker's first message before answering, so a prompt that does not fit is
a 400 even for a streamed request. From the moment the body is read, a watcher task waits on the
connection: a client that hangs up while its request is queued or generating (streamed or not, one
answer or n) has its job cancelled at once, and the worker stops it within a round.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..decoding.events import Stats
from ..errors import BadInput
from . import api, prompts, responses, tokens, toolcalls
from .api import Defaults, GenRequest
from .fields import ApiError, Kind
from .guard import HostPolicy, RequestGuard, default_max_body
from .page import HEADERS as PAGE_HEADERS
from .page import render_page
from .responses import Choice, LogprobEntry, Reply
from .worker import Backend, Delta, Finished, Job, Message, Started, Worker

#: Paths answered without the API key: a health check needs no secret, and the page holds none (its
#: requests to the API send the key the user types in).
OPEN_PATHS = frozenset({"/health", "/"})
T = TypeVar("T")


def create_app(
    worker: Worker,
    *,
    model: str,
    defaults: Defaults,
    api_key: str | None = None,
    info: Mapping[str, object] | None = None,
    policy: HostPolicy | None = None,
    max_body: int | None = None,
) -> Starlette:
    """The ASGI app serving `worker`'s models under the id `model`; `info` goes into /v1/models.
    `policy`: the Host names served (default: a server on 127.0.0.1); `max_body`: the largest request
    body in bytes (default: one that holds the target's whole context, guard.default_max_body)."""
    created = int(time.time())

    async def chat_completions(request: Request) -> Response:
        return await _generate(request, "chat", worker, model, defaults)

    async def completions(request: Request) -> Response:
        return await _generate(request, "completion", worker, model, defaults)

    async def models(request: Request) -> Response:
        entry = {"id": model, "object": "model", "created": created, "owned_by": "specchat", **(info or {})}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model, **worker.status()})

    async def tokenize(request: Request) -> Response:
        req = tokens.parse_tokenize(api.parse_json(await request.body()))
        return JSONResponse(await _call(worker, partial(tokens.run_tokenize, req)))

    async def detokenize(request: Request) -> Response:
        ids = tokens.parse_detokenize(api.parse_json(await request.body()))
        return JSONResponse(await _call(worker, partial(tokens.run_detokenize, ids)))

    async def tokenizer_info(request: Request) -> Response:
        facts = await _call(worker, lambda backend: backend.tokenizer_facts())
        return JSONResponse(tokens.tokenizer_info(facts, model))

    async def clear_prompt_cache(request: Request) -> Response:
        cache = worker.cache
        if cache is None:
            raise ApiError("this server has no prompt cache", status=404, code="not_found")
        # on the model thread, between rounds: the worker is the only other user of the cache
        freed = await _call(worker, lambda _backend: cache.clear())
        return JSONResponse({"cleared": freed, "prompt_cache": cache.status()})

    html = render_page(
        model=model, api_key=api_key is not None, drafter_sources=[d.source for d in worker.backend.drafters]
    )

    async def index(request: Request) -> Response:
        return HTMLResponse(html, headers=PAGE_HEADERS)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/prompt_cache", clear_prompt_cache, methods=["DELETE"]),
        *(
            Route(f"{prefix}/{name}", handler, methods=[method])
            for prefix in ("", "/v1")
            for name, handler, method in (
                ("tokenize", tokenize, "POST"),
                ("detokenize", detokenize, "POST"),
                ("tokenizer_info", tokenizer_info, "GET"),
            )
        ),
    ]
    if max_body is None:
        max_body = default_max_body(worker.backend.target.n_ctx)
    guard = Middleware(RequestGuard, policy=policy or HostPolicy(), max_body=max_body)
    return Starlette(
        routes=routes,
        middleware=[guard, *([Middleware(ApiKeyCheck, key=api_key)] if api_key else [])],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
    )


async def _generate(request: Request, kind: Kind, worker: Worker, model: str, defaults: Defaults) -> Response:
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone while still sending the body
        return Response(status_code=204)
    req = api.parse_request(kind, api.parse_json(raw), defaults)
    job = Job(req, asyncio.get_running_loop())
    worker.submit(job)
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(_watch_hang_up(request, job, gone))
    streaming = False
    try:
        first = await _next(job, gone)  # waits while queued, then the prompt check
        if first is None:
            return Response(status_code=204)  # the client left; nobody reads this
        if isinstance(first, ApiError):
            raise first
        assert isinstance(first, Started)
        reply = _echoing(Reply.new(kind, model), first, req)
        if req.stream:
            streaming = True  # the stream owns the job now: it watches the client and cancels the job
            watcher.cancel()
            return _JobStream(job, _sse(job, reply, req))
        return await _collect(job, gone, req, reply)
    finally:
        watcher.cancel()
        if not streaming:
            job.cancel()  # finished: a no-op; the client left or we failed: stop generating for it


async def _collect(job: Job, gone: asyncio.Event, req: GenRequest, reply: Reply) -> Response:
    """A non-streamed response: every answer's text gathered, then one JSON body (204 when the
    client hung up meanwhile)."""
    replies = [reply]  # one per prompt (several: a completion's prompt array)
    texts: list[list[str]] = [[] for _ in range(req.choices)]
    entries: list[list[LogprobEntry]] = [[] for _ in range(req.choices)]
    choices: list[Choice] = []
    cached: list[int] = []  # per prompt
    while len(choices) < req.choices:
        msg = await _next(job, gone)
        if msg is None:
            return Response(status_code=204)
        if isinstance(msg, ApiError):
            raise msg
        if isinstance(msg, Started):  # the next prompt's answers follow
            replies.append(_echoing(reply, msg, req))
        elif isinstance(msg, Delta):
            texts[msg.index].extend(t for t, _ in msg.pieces)
            entries[msg.index].extend(msg.logprobs)
        elif isinstance(msg, Finished):
            if msg.index % req.n == 0:  # what the prompt's first answer found cached (nothing:
                cached.append(0 if replies[-1].echo_logprobs else msg.cached)  # echo re-read it)
            lp = tuple(entries[msg.index]) if req.logprobs is not None else None
            text = "".join(texts[msg.index])
            choices.append(Choice(msg.index, text, msg.finish_reason, msg.stats, lp))
    parts = [(r, choices[i * req.n : (i + 1) * req.n], cached[i]) for i, r in enumerate(replies)]
    body = prompts.batch_body(parts, req.n)
    if req.tools is not None:  # the calls in each answer become message.tool_calls
        for choice in body["choices"]:  # type: ignore[attr-defined]
            toolcalls.patch_message(choice, req.tools)
    return JSONResponse(body)


async def _watch_hang_up(request: Request, job: Job, gone: asyncio.Event) -> None:
    """Wait on the connection (the body is read: what comes next is the hang-up) and cancel the job
    the moment the client leaves, whatever the worker is sending meanwhile."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            gone.set()
            return


async def _call(worker: Worker, fn: Callable[[Backend], T]) -> T:
    """`fn(backend)` run on the model thread as a quick job (Worker.call); its ApiError is the reply."""
    return await asyncio.wrap_future(worker.call(fn))


def _echoing(reply: Reply, started: Started, req: GenRequest) -> Reply:
    """The reply for the prompt `started` opens: its echo (with echo: true) and its echoed logprobs."""
    return replace(reply, echo=started.echo if req.echo else "", echo_logprobs=started.prompt_logprobs)


async def _next(job: Job, gone: asyncio.Event) -> Message | None:
    """The job's next message, or None once the client has hung up."""
    if gone.is_set():
        return None
    getter = asyncio.ensure_future(job.out.get())
    leaving = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({getter, leaving}, return_when=asyncio.FIRST_COMPLETED)
        return getter.result() if getter.done() else None
    finally:
        for task in (getter, leaving):
            if not task.done():
                task.cancel()


class _JobStream(StreamingResponse):
    """A server-sent-event response that cancels its job however it ends: complete, or the client
    hanging up (Starlette then cancels the response, possibly before the stream even started)."""

    def __init__(self, job: Job, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _sse(job: Job, reply: Reply, req: GenRequest) -> AsyncIterator[str]:
    """Server-sent events: per answer (n per prompt, one after another) its opening chunk, chunks as
    the worker sends rounds and its final chunk; the usage chunk if asked; then [DONE]."""
    opens = reply.kind == "chat" or req.echo  # a role, or the echoed prompt, comes first
    replies = [reply]  # one per prompt
    stats: list[Stats] = []
    cached = 0
    calls = toolcalls.StreamedCalls(req.tools) if req.tools is not None else None
    if opens:
        yield _event(reply.chunk(first=True))
    while len(stats) < req.choices:
        msg = await job.out.get()
        if isinstance(msg, Delta):
            lp = msg.logprobs if req.logprobs is not None else None
            if calls is not None:  # tools offered: what may be a call is held back until decided
                for chunk in calls.delta(replies[-1], msg.index, msg.pieces, lp, msg.progress):
                    yield _event(chunk)
                continue
            chunk = replies[-1].chunk(msg.pieces, index=msg.index, logprobs=lp, progress=msg.progress)
            yield _event(chunk)
        elif isinstance(msg, Finished):
            if msg.index % req.n == 0:
                cached += 0 if replies[-1].echo_logprobs else msg.cached
            stats.append(msg.stats)
            totals = stats if len(stats) == req.choices else ()
            reason = msg.finish_reason
            if calls is not None:
                held, reason = calls.finish(replies[-1], msg.index, reason)
                for chunk in held:
                    yield _event(chunk)
            final = replies[-1].final_chunk(msg.index, reason, msg.stats, totals=totals, cached=cached)
            if totals and len(replies) > 1:
                final["usage"] = responses.usage(stats, cached, req.n)
            yield _event(final)
            if opens and len(stats) < req.choices and len(stats) % req.n:
                yield _event(replies[-1].chunk(index=len(stats), first=True))
        elif isinstance(msg, Started):  # the next prompt's answers follow
            replies.append(_echoing(reply, msg, req))
            if opens:
                yield _event(replies[-1].chunk(index=msg.index, first=True))
        elif isinstance(msg, ApiError):  # failed mid-stream: OpenAI sends the error as an event
            yield _event(msg.body())
            break
        else:
            raise TypeError(f"unexpected message {msg!r}")
    if req.include_usage and len(stats) == req.choices:
        usage_chunk = reply.usage_chunk(stats, cached)
        if len(replies) > 1:
            usage_chunk["usage"] = responses.usage(stats, cached, req.n)
        yield _event(usage_chunk)
    yield "data: [DONE]\n\n"


def _event(obj: object) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# --- errors and auth -------------------------------------------------------------------------------------


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; this server has /v1/chat/completions, "
        message += "/v1/completions, /v1/models, /tokenize, /detokenize, /tokenizer_info, /health, "
        message += "DELETE /prompt_cache and the page at /"
    else:
        message = f"{request.method} is not allowed on {request.url.path}"
    code = "not_found" if exc.status_code == 404 else "method_not_allowed"
    err = ApiError(message, status=exc.status_code, code=code, headers=exc.headers)
    return _error_response(err)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug or an engine failure: a JSON 500 for the client (uvicorn logs the traceback)."""
    return _error_response(ApiError(f"internal error: {type(exc).__name__}", status=500, type="server_error"))


class ApiKeyCheck:
    """ASGI middleware: requests without `Authorization: Bearer KEY` get 401 (except OPEN_PATHS)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                err = ApiError(
                    "missing or wrong API key: send the server's --api-key as `Authorization: Bearer KEY`",
                    status=401,
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await _error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# --- running it ------------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (before models load) so a port in use is reported at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}", "check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise BadInput(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "pick another --port (0 = any free one), or stop what uses it",
        ) from None
    return sock


class ServerThread:
    """uvicorn serving `app` on an already bound socket, in a thread of its own.

    A thread, not the main thread, so that signal handling stays with the caller: `specchat serve`
    turns Ctrl-C / SIGTERM into an orderly stop (end the answer, exit 0), which uvicorn's own
    handlers (re-raising the signal after shutdown) would not give. Tests run it the same way.
    """

    def __init__(self, app: ASGIApp, sock: socket.socket, *, graceful_seconds: float = 10.0) -> None:
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(graceful_seconds),
        )
        self.sock = sock
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="specchat-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self, timeout: float = 10.0) -> None:
        """Start serving; returns once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let open responses finish (within the graceful time), close the socket."""
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    def force_stop(self) -> None:
        self.server.force_exit = True
