"""The requests a hostile web page or a careless client sends, against any OpenAI-compatible server,
side by side: `specchat serve` and `llama-server` on the same model answer the same list.

For each: the status, the first line of the error, the seconds it took, and whether /health still
answers after it; then the server's resident memory if its pid is given. Ordinary requests through
the `openai` client come first (a chat, a stream, a schema, a tool call), so a server that refuses
everything does not look safe.

    python tests/perf/hostile_requests.py http://127.0.0.1:8080 [--pid PID] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import httpx
import openai

HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]
CHAT = {"model": "m", "messages": HELLO, "max_tokens": 8}


def _chat(**extra: object) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


def _deep(n: int) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * n + b"]" * n + b"}"


#: (name, path, body, headers)
HOSTILE: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("Host: evil.example", "/v1/chat/completions", _chat(), {"Host": "evil.example"}),
    (
        "cross-site text/plain",
        "/v1/chat/completions",
        _chat(),
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},
    ),
    (
        "grammar 20,000 deep",
        "/v1/chat/completions",
        _chat(grammar="root ::= " + "(" * 20_000 + '"x"' + ")" * 20_000),
        {},
    ),
    (
        "maxLength 1e9",
        "/v1/chat/completions",
        _chat(json_schema={"type": "string", "maxLength": 1_000_000_000}),
        {},
    ),
    (
        "minItems 1e8",
        "/v1/chat/completions",
        _chat(json_schema={"type": "array", "items": {"type": "integer"}, "minItems": 100_000_000}),
        {},
    ),
    (
        "enum of 100,000",
        "/v1/chat/completions",
        _chat(json_schema={"enum": [f"v{i}" for i in range(100_000)]}),
        {},
    ),
    (
        "55.7 MB message",
        "/v1/chat/completions",
        json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 55_700_000}]}).encode(),
        {},
    ),
    ("JSON 1,000 deep", "/v1/chat/completions", _deep(1000), {}),
    ("seed -2", "/v1/chat/completions", _chat(seed=-2), {}),
]


def ordinary(base: str) -> list[tuple[str, str]]:
    """What a real client does, through the openai package: (what, outcome)."""
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=300)
    out: list[tuple[str, str]] = []

    def run(what: str, fn: Callable[[], str]) -> None:
        started = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            result = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
        out.append((what, f"{result}  ({time.monotonic() - started:.1f} s)"))

    run(
        "chat",
        lambda: repr(
            c.chat.completions.create(model="m", messages=HELLO, max_tokens=16).choices[0].message.content
        ),
    )
    run(
        "stream",
        lambda: repr(
            "".join(
                ch.choices[0].delta.content or ""
                for ch in c.chat.completions.create(model="m", messages=HELLO, max_tokens=16, stream=True)
                if ch.choices
            )
        ),
    )
    schema = {
        "type": "object",
        "properties": {"sea": {"type": "string", "maxLength": 20}},
        "required": ["sea"],
    }
    run(
        "json_schema",
        lambda: repr(
            c.chat.completions.create(
                model="m",
                messages=HELLO,
                max_tokens=24,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )
            .choices[0]
            .message.content
        ),
    )
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    run(
        "tool_choice required",
        lambda: repr(
            c.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "Weather in Paris?"}],
                max_tokens=32,
                tools=[tool],
                tool_choice="required",
            )
            .choices[0]
            .message.tool_calls
        ),
    )
    return out


def hang_up(base: str) -> str:
    """A non-streamed n=4 request whose client leaves after 1 s: how long the server stays busy
    (measured as the time until a 1-token request is answered)."""
    body = {**CHAT, "n": 4, "max_tokens": 400}
    left = time.monotonic()
    try:
        httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1.0)
        httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 1}, timeout=600)
    except httpx.TimeoutException:
        left = time.monotonic()
        httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 1}, timeout=600)
    except httpx.HTTPError as exc:
        return f"no answer ({type(exc).__name__})"
    return f"next request answered {time.monotonic() - left:.1f} s after the hang-up"


def rss_mb(pid: int | None) -> str:
    if pid is None:
        return ""
    import psutil

    try:
        return f"{psutil.Process(pid).memory_info().rss / 2**20:,.0f} MB"
    except psutil.NoSuchProcess:
        return "GONE"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="the server's process, to report its memory")
    ap.add_argument("--label", default="")
    ap.add_argument("--skip", action="append", default=[], help="leave out requests whose name has this")
    args = ap.parse_args()
    base = args.base.rstrip("/")
    print(f"== {args.label or base}")
    for what, outcome in ordinary(base):
        print(f"  {what:<24} {outcome}")
    for name, path, body, headers in HOSTILE:
        if any(s in name for s in args.skip):
            continue
        started = time.monotonic()
        try:
            r = httpx.post(
                f"{base}{path}",
                content=body,
                headers={"Content-Type": "application/json", **headers},
                timeout=300,
            )
            status = str(r.status_code)
            try:
                detail = str(r.json().get("error", {}).get("message", ""))
            except ValueError:
                detail = r.text
        except httpx.HTTPError as exc:
            status, detail = "no answer", type(exc).__name__
        took = time.monotonic() - started
        try:
            alive = httpx.get(f"{base}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            alive = False
        line = detail.splitlines()[0][:90] if detail else ""
        print(f"  {name:<24} {status:<9} {took:6.1f} s  alive={alive}  {rss_mb(args.pid)}  {line}")
    print(f"  {'hang-up, n=4':<24} {hang_up(base)}")


if __name__ == "__main__":
    main()
