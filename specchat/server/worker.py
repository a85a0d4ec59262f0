"""The one model thread: requests run one at a time, in order, on the one model pair.

Why one thread, apart from the HTTP event loop: llama.cpp contexts are not thread-safe, and a
generation is seconds of blocking native calls that must not stall the HTTP event loop. So every use
of the models (template rendering, tokenizing, generating) happens on the thread that runs `Worker.run`,
and the HTTP side only exchanges messages with it: it submits a `Job` and reads `Started`, `Delta`,
`Finished` or an `ApiError` from the job's asyncio queue.

Why `specchat serve` runs it on the thread that loaded the models (its main thread) rather than a
thread of its own: llama.cpp's CPU backend computes with OpenMP, and libgomp keeps a team of helper
threads per thread that ever ran a parallel region. Loading a drafter calibrates the target (decodes
on the loading thread), so a second generating thread made a second team: with more OpenMP threads
than cores, libgomp spins only ~100 times at each barrier before sleeping in the kernel, and the
hundreds of barriers of every decode cost ~12 ms a token in futex wake-ups (measured: 3,000 context
switches a second, 0.67-0.86x of `--no-draft` serving). One thread for every llama.cpp
call keeps one team, as `run` and `chat` have.

Quick jobs (tokenizing, detokenizing, the tokenizer's facts: `Worker.call`) touch the vocabulary,
never a KV cache, so they need not wait for a whole generation: the worker runs them before the next
queued request and also between two rounds of the current answer, so one waits at most a round.

Waiting requests form a bounded queue; beyond it `submit` refuses with 503 and a Retry-After estimate.
A job is cancelled by its client hanging up or by shutdown: the worker sees it at the next event and
closes the generator, which leaves both caches holding a prefix of what was committed (see
loop.generate), so the next request reuses them safely.

A target split over RPC workers whose worker dies answers 503 until the models are loaded anew
(availability.py); quick jobs keep being answered from the old models' vocabulary meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from ..decoding.constraint import CompiledGrammar, GrammarSpec
from ..decoding.events import Done, Round, Stats, Token
from ..decoding.loop import Detokenizer, Planner, Tally
from ..decoding.model import Model
from ..decoding.prompt_cache import Prepared, PromptCache
from ..decoding.session import Engine, answer_events, follow_temperature
from ..decoding.settings import SettingError
from ..errors import ContextFull, SpecchatError, WorkerError
from .api import GenRequest
from .availability import Availability, unavailable
from .echo import prompt_logprobs
from .fields import ApiError
from .responses import LogprobEntry, Progress, finish_reason, logprob_entry
from .stops import Piece, StopFilter, TokenGate
from .tokens import Tokenizer, check_ids
from .tools import prepare

T = TypeVar("T")
#: The most quick jobs (Worker.call) that may wait at once; beyond it they get 503 as generations do.
QUICK_QUEUE = 64
#: How long the idle loop sleeps between looks at its queue and at pending signal handlers (see _loop).
IDLE_WAKE_SECONDS = 0.25
#: Loads the models again once every RPC worker answers (WorkerError, touching nothing, while one does
#: not): the new backend and its prompt cache (availability.py).
Revive = Callable[[], "tuple[Backend, PromptCache | None]"]


class Backend(Engine, Tokenizer, Protocol):
    """What the server needs from the loaded models: a chat `Engine`, plus plain-text prompts for
    /v1/completions, planners with a seed of their own and the tokenizer endpoints' `Tokenizer`.
    `loader.LoadedEngine` is one."""

    def render_text(self, text: str) -> tuple[list[int], str | None]:
        """Token ids of `text` as a plain prompt; ContextFull when it does not fit."""
        ...

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str | None]:
        """The conversation's token ids in the chat template, `tools` and `template_kwargs` (its
        extra variables) handed to it when given."""
        ...

    def planner(self, k: int | None, *, seed: int | None = None) -> Planner: ...

    def constraint(self, spec: GrammarSpec) -> CompiledGrammar:
        """`spec` compiled for the target's vocabulary; a SpecchatError says why it cannot be."""
        ...


@dataclass(frozen=True, slots=True)
class Started:
    """The request's prompt is rendered and fits: generation begins (HTTP 200 can be sent).
    `prompt_logprobs`: the prompt's own, for a completion with echo and logprobs (server/echo.py).
    A completion with several prompts gets one per prompt, before its answers: `index` is its first
    answer's, `echo` its text (token-id prompts: their tokens' text)."""

    prompt_tokens: int
    prompt_logprobs: tuple[LogprobEntry, ...] = ()
    index: int = 0
    echo: str = ""


@dataclass(frozen=True, slots=True)
class Delta:
    """Text of one round (one target pass) of answer `index`, split by token, each piece with its
    token's source; the logprobs of the tokens now sent (when asked); the answer's figures so far."""

    pieces: tuple[Piece, ...]
    index: int = 0
    logprobs: tuple[LogprobEntry, ...] = ()
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """Answer `index` is complete (a request with n answers gets n of these, in order)."""

    stats: Stats
    finish_reason: str
    cached: int  # prompt tokens found in the KV cache (OpenAI's usage.prompt_tokens_details)
    index: int = 0


Message = Started | Delta | Finished | ApiError


class Job:
    """One request between the HTTP side (its own event loop) and the worker thread."""

    def __init__(self, request: GenRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.out: asyncio.Queue[Message] = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop this job: before it starts, or within the round it is in."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, message: Message) -> None:
        """Hand a message to the HTTP side (from the worker thread)."""
        with suppress(RuntimeError):  # the event loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self.out.put_nowait, message)


def choice_seed(seed: int, index: int) -> int:
    """The seed of answer `index` of a seeded request: the request's own for the first (so n=1 and
    the first of n agree), and one derived from (seed, index) for the others, so each differs and
    every one repeats."""
    if index == 0:
        return seed
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def cached_tokens(stats: Stats) -> int:
    """Prompt tokens the target did not have to decode: all but the prefill and the last prompt token,
    which the first round always decodes (loop.generate)."""
    return max(0, stats.prompt_tokens - 1 - stats.prefill_tokens)


class Worker:
    """Runs jobs one at a time on `backend`. `queue_size` jobs may wait while one runs."""

    def __init__(
        self,
        backend: Backend,
        *,
        k: int | None = None,
        p_min: float | None = None,
        seed: int | None = None,
        queue_size: int = 8,
        log: Callable[[str], None] = lambda _line: None,
        cache: PromptCache | None = None,
        revive: Revive | None = None,
    ) -> None:
        self.backend = backend
        #: conversations put aside between requests (decoding/prompt_cache.py); None: only the one
        #: the models' caches hold is reused
        self.cache = cache
        self.k = k
        self.p_min = p_min  # None: follows each request's temperature
        self.queue_size = queue_size
        self.log = log
        # one planner for requests without a seed, so what it learns about acceptance carries over
        self._planner = backend.planner(k) if backend.drafters else None
        self._rng = np.random.default_rng(seed)
        self._waiting: deque[Job] = deque()
        self._quick: deque[tuple[Callable[[Backend], object], concurrent.futures.Future[object]]] = deque()
        self._current: Job | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._seconds = 5.0  # running mean of a job's duration, for Retry-After
        self._warned: set[str] = set()  # template warnings logged already
        self._thread: threading.Thread | None = None
        #: a split target's RPC worker lost, and the models' revival (availability.py)
        self._available: Availability[tuple[Backend, PromptCache | None]] = Availability(revive, log)

    # --- the model thread -------------------------------------------------------------------------
    def run(self) -> None:
        """Serve jobs on the calling thread until `shutdown`. Call it on the thread that loaded the
        models (see the module docstring: one thread for every llama.cpp call)."""
        self._loop()

    def start(self) -> None:
        """Serve jobs on a thread of its own (tests, and models that never ran on another thread)."""
        self._thread = threading.Thread(target=self._loop, name="specchat-generate", daemon=True)
        self._thread.start()

    # --- the HTTP side ----------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it with 503 when the queue is full or the server is stopping."""
        with self._cond:
            if self._stopping:
                raise _shutting_down()
            busy = self._current is not None
            if busy + len(self._waiting) >= 1 + self.queue_size:
                wait = math.ceil(self._seconds * (len(self._waiting) + 1))
                raise ApiError(
                    f"the server is busy: one request generating and {len(self._waiting)} waiting "
                    f"(--queue {self.queue_size}); retry in about {wait} s",
                    status=503,
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": str(max(1, wait))},
                )
            self._waiting.append(job)
            self._cond.notify()

    def call(self, fn: Callable[[Backend], T]) -> concurrent.futures.Future[T]:
        """Run `fn(backend)` on the model thread, before the next queued generation and between the
        rounds of the current one; for quick work that must not decode (the tokenizer endpoints read
        the vocabulary, DELETE /prompt_cache drops saved conversations)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise _shutting_down()
            if len(self._quick) >= QUICK_QUEUE:
                raise ApiError(
                    f"the server is busy: {len(self._quick)} quick requests waiting; retry in a second",
                    status=503,
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            self._quick.append((fn, future))  # type: ignore[arg-type]
            self._cond.notify()
        return future

    def status(self) -> dict[str, object]:
        with self._cond:
            out: dict[str, object] = {
                "busy": self._current is not None,
                "waiting": len(self._waiting),
                "stopping": self._stopping,
            }
        if self._available.reason is not None:
            out["unavailable"] = self._available.reason
        if self.cache is not None and self._available.broken is None:
            out["prompt_cache"] = self.cache.status()
        return out

    def shutdown(self) -> None:
        """Stop accepting, end the current answer within a round, refuse the waiting ones."""
        with self._cond:
            self._stopping = True
            waiting = list(self._waiting)
            self._waiting.clear()
            quick = [future for _, future in self._quick]
            self._quick.clear()
            if self._current is not None:
                self._current.cancel()
            self._cond.notify_all()
        for job in waiting:
            job.emit(_shutting_down())
        for future in quick:
            if future.set_running_or_notify_cancel():
                future.set_exception(_shutting_down())

    def join(self, timeout: float | None = None) -> bool:
        """Wait for `start`'s thread to end (after shutdown); True when it has (or never started:
        `run` returns only once the loop has ended)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            self._run_quick()
            with self._cond:
                while not self._waiting and not self._quick and not self._stopping:
                    if self._available.due():
                        break
                    # never an unbounded wait: `specchat serve` runs this loop on the main thread, and a
                    # Ctrl-C the kernel hands to another thread runs Python's handler only once the main
                    # thread runs bytecode again; blocked without a timeout, serve never saw it
                    self._cond.wait(IDLE_WAKE_SECONDS)
                if self._quick:
                    continue
                if not self._waiting:
                    if self._stopping:
                        return
                    job = None
                else:
                    job = self._current = self._waiting.popleft()
            if job is None:  # idle, and time to ask whether a lost RPC worker is back
                self._take(self._available.try_revive())
                continue
            start = time.monotonic()
            try:
                if not job.cancelled:
                    self._take(self._available.check())  # 503 while a worker is gone
                    self._run(job)
            except ApiError as exc:  # the request cannot be served as sent: its client is told why
                job.emit(exc)
            except WorkerError as exc:  # an RPC worker of a split target went away: not the request's fault
                self.log(f"error: {exc}")
                job.emit(self._available.worker_lost(exc))
            except Exception as exc:  # an engine failure: this request fails, the server keeps serving
                self.log(f"error: generation failed:\n{traceback.format_exc().rstrip()}")
                job.emit(ApiError(f"generation failed: {_one_line(exc)}", status=500, type="server_error"))
            finally:
                with self._cond:
                    self._current = None
                    self._seconds = 0.7 * self._seconds + 0.3 * (time.monotonic() - start)

    def _take(self, revived: tuple[Backend, PromptCache | None] | None) -> None:
        """Serve from models loaded anew (availability.py), with a planner of their own."""
        if revived is not None:
            self.backend, self.cache = revived
            self._planner = self.backend.planner(self.k) if self.backend.drafters else None

    def _run_quick(self) -> None:
        """Run the quick jobs waiting now (on the model thread, between rounds or requests)."""
        while True:
            with self._cond:
                if not self._quick:
                    return
                fn, future = self._quick.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # its client left
            if self._available.broken is not None:
                future.set_exception(unavailable(self._available.broken))
                continue
            try:
                future.set_result(fn(self.backend))
            except Exception as exc:  # the caller's to report (an ApiError, or a 500)
                future.set_exception(exc)

    def _run(self, job: Job) -> None:
        """Generate every answer of `job`; an ApiError raised here (before or between answers) is
        the client's reply, any other exception an engine failure (_loop)."""
        req = job.request
        prompts = [self._prompt(job, given) for given in req.prompts or (None,)]  # one too long: 400
        try:
            req.params.check_vocab(self.backend.target.n_vocab)  # a logit_bias id the model lacks
        except SettingError as exc:
            raise ApiError(exc.line(exc.setting.name), param=exc.setting.name) from None
        grammar = self._grammar(job)
        echo_lp = req.echo and req.logprobs is not None
        for p, prompt in enumerate(prompts):
            # an echo with logprobs re-reads its whole prompt: put the cached conversation aside, restore none
            prepared = self.cache.prepare(prompt, restore=not echo_lp) if self.cache is not None else None
            echoed = ()
            if echo_lp:
                echoed = prompt_logprobs(self.backend.target, prompt, req.logprobs or 0)
            job.emit(Started(len(prompt), echoed, p * req.n, self._echo(req, p, prompt)))
            for index in range(p * req.n, (p + 1) * req.n):  # each reuses the prompt the cache holds
                if job.cancelled or req.max_tokens == 0:  # hung up, shutting down, or echo only
                    reason = "interrupted" if job.cancelled else "max_tokens"
                    empty = Tally(prompt_tokens=len(prompt)).snapshot(reason)
                    job.emit(Finished(empty, "length", 0, index))
                else:
                    first = index == p * req.n
                    self._answer(job, prompt, index, prepared if first else None, grammar)
        if grammar is not None:
            grammar.close()  # (after an engine failure, garbage collection frees it)

    def _render_chat(self, req: GenRequest) -> tuple[list[int], str | None]:
        """The chat's tokens; tools, or a conversation with tool calls, go through tools.prepare
        first (the template's own `tools`, or the tools described in the system message)."""
        messages = list(req.messages)
        variables = req.template_kwargs  # the command line's under the request's (api.parse_request)
        if req.tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            return self.backend.render(messages, template_kwargs=variables)
        template = self.backend.tokenizer_facts().get("chat_template")
        messages, offered = prepare(messages, req.tools, template if isinstance(template, str) else None)
        return self.backend.render(messages, tools=offered, template_kwargs=variables)

    def _echo(self, req: GenRequest, p: int, prompt: Sequence[int]) -> str:
        """Prompt p's text as echoed: as sent, or for token ids their text as the answer's would be."""
        given = req.prompts[p] if req.prompts else req.prompt
        if isinstance(given, str) or not req.echo:
            return given if isinstance(given, str) else ""
        detok = Detokenizer(self.backend.target)
        return "".join(detok.piece(t) for t in prompt) + detok.flush()

    def _grammar(self, job: Job) -> CompiledGrammar | None:
        """The request's grammar compiled once, before the response starts (so a bad one is a 400
        naming its field)."""
        spec = job.request.grammar
        if spec is None:
            return None
        try:
            return self.backend.constraint(spec)
        except SpecchatError as exc:
            raise ApiError(f"invalid {spec.param}: {_plain(exc)}", param=spec.param) from None

    def _answer(
        self,
        job: Job,
        prompt: list[int],
        index: int,
        prepared: Prepared | None = None,
        grammar: CompiledGrammar | None = None,
    ) -> None:
        req = job.request
        backend = self.backend
        params = req.params
        drafters = list(backend.drafters) if req.draft else []  # `speculative: false`: target alone
        follow_temperature(drafters, self.p_min, params, auto=self.k is None)
        if req.seed is None:
            planner, rng = (self._planner if drafters else None), self._rng
        else:  # a seeded request repeats: its own planner and sampler, both from the seed
            seed = choice_seed(req.seed, index)
            planner = backend.planner(self.k, seed=seed) if drafters else None
            rng = np.random.default_rng(seed)
        tally = Tally()
        constraint = grammar.start() if grammar is not None else None  # each answer from the start
        events = answer_events(
            backend,
            prompt,
            drafters=drafters,
            planner=planner,
            params=params,
            max_tokens=req.max_tokens,
            rng=rng,
            tally=tally,
            logprobs=req.logprobs,
            constraint=constraint,
        )
        stops = StopFilter(req.stop)
        gate: TokenGate[LogprobEntry] | None = TokenGate() if req.logprobs is not None else None
        pending: list[Piece] = []
        stats: Stats | None = None
        try:
            for ev in events:
                if job.cancelled:
                    break
                if isinstance(ev, Token):
                    pending.append((ev.text, ev.source.value))
                    if gate is not None and ev.logprob is not None:
                        entry = logprob_entry(ev.id, ev.logprob, gate.fed, backend.target.token_bytes)
                        gate.add(len(ev.text), entry)
                elif isinstance(ev, Round):
                    self._send(job, index, stops.feed(pending), gate, Progress.of(tally))
                    pending = []
                    self._run_quick()  # tokenizer requests wait a round at most
                    if stops.stopped:
                        break
                elif isinstance(ev, Done):
                    stats = ev.stats
        finally:
            events.close()  # within the round: caches keep a prefix of what was committed
            if constraint is not None:
                constraint.close()
        if stats is None:
            stats = tally.snapshot("stop_string" if stops.stopped else "interrupted")
        last = [*stops.feed(pending), *stops.flush()]
        self._send(job, index, last, gate, Progress.of(tally), end=stops.stopped)
        cached = cached_tokens(stats)
        reason = finish_reason(stats.stop_reason, stopped_by_string=stops.stopped)
        job.emit(Finished(stats, reason, cached, index))
        line = _summary(req, stats, cached, index)
        if prepared is not None and (prepared.restored or prepared.saved) and self.cache is not None:
            what = f"{prepared.restored} restored" if prepared.restored else "none restored"
            line += f" · prompt cache: {what} in {prepared.seconds * 1000:.0f} ms, {self.cache.summary()}"
        self.log(line)

    def _prompt(self, job: Job, given: str | tuple[int, ...] | None = None) -> list[int]:
        """The request's token ids through the chat template (or as plain text, or `given`: one of a
        completion's prompts); an ApiError saying why not (a prompt beyond the context, a template
        that refuses the messages, a token id the vocabulary lacks). A template's warning (a
        system message it dropped, say) goes to the log: the person running the server should know."""
        req = job.request
        param = "messages" if req.kind == "chat" else "prompt"
        warning = None
        try:
            if req.kind == "chat":
                tokens, warning = self._render_chat(req)
            elif isinstance(given, tuple):
                tokens = token_prompt(given, self.backend.target)
            else:
                tokens, warning = self.backend.render_text(req.prompt if given is None else given)
        except ContextFull as exc:
            raise ApiError(_plain(exc), param=param, code="context_length_exceeded") from None
        except SpecchatError as exc:
            raise ApiError(_plain(exc), param=param) from None
        if warning and warning not in self._warned:  # once: every request would say the same
            self._warned.add(warning)
            self.log(f"warning: {warning}")
        return tokens

    @staticmethod
    def _send(
        job: Job,
        index: int,
        pieces: Sequence[Piece],
        gate: TokenGate[LogprobEntry] | None,
        progress: Progress,
        *,
        end: bool | None = None,
    ) -> None:
        """Send what the stop filter let through, with the logprobs now due; `end`: the answer's
        last send (True when a stop string ended it)."""
        entries: list[LogprobEntry] = []
        if gate is not None:
            entries = gate.release(sum(len(t) for t, _ in pieces))
            if end is not None:
                entries += gate.finish(stopped=end)
        if pieces or entries:
            job.emit(Delta(tuple(pieces), index, tuple(entries), progress))


def token_prompt(tokens: Sequence[int], target: Model) -> list[int]:
    """A prompt sent as token ids, decoded as given: ids the vocabulary has, and room to answer."""
    check_ids(tokens, target.n_vocab, "prompt")
    if len(tokens) >= target.n_ctx:
        raise ContextFull(
            f"the prompt is {len(tokens)} tokens but the context window is {target.n_ctx}",
            "raise --ctx-size or shorten the prompt",
        )
    return list(tokens)


def _shutting_down() -> ApiError:
    return ApiError("the server is shutting down", status=503, type="server_error", code="shutting_down")


def _one_line(exc: BaseException) -> str:
    """An exception as one line for a client: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _plain(err: SpecchatError) -> str:
    """A SpecchatError's line for an HTTP client (its CLI hints name options, which still helps)."""
    return f"{err.message} ({err.hint})" if err.hint else err.message


def _summary(req: GenRequest, stats: Stats, cached: int, index: int = 0) -> str:
    """One log line per answer: what the loop did, for the person watching the server."""
    which = f" {index + 1}/{req.n}" if req.n > 1 else ""
    parts = [
        f"{req.kind}{which}: {stats.prompt_tokens} prompt tokens ({cached} cached)",
        f"{stats.generated_tokens} generated, {stats.tokens_per_second:.1f} tok/s",
    ]
    if stats.drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_pass:.2f} tok/pass")
    parts.append(stats.stop_reason.replace("_", " "))
    return " · ".join(parts)
