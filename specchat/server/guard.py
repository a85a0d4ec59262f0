"""Who may talk to the server, and how much they may send: the checks every request passes before any
route sees it.

`specchat serve` listens on 127.0.0.1 without a key by default (as llama-server and Ollama do), so
every web page the user opens can reach it. A page cannot read the answers (no CORS headers are
sent), but it can make the browser *send* requests, and two kinds get through unless the server
refuses them:

* **DNS rebinding**: a page at `evil.example` re-points its own name at 127.0.0.1 and is then
  same-origin with the server as far as the browser knows. The only trace left is the `Host`
  header, which still says `evil.example`; so a request is served only when its Host is a name this
  server answers to: the address it is bound to, `localhost`, `127.0.0.1`, `[::1]`, this machine's
  own addresses when bound to every interface (an address typed into a browser cannot be rebound),
  or a name given with `--allowed-host` (a LAN name, a reverse proxy's public name). An API key
  does not lift the check: a rebinding page never knows the key, but the key on the command line is
  no reason to trust a foreign Host.
* **"Simple" cross-site requests**: a form or `fetch(..., {mode: "no-cors"})` POSTs `text/plain`
  with no preflight. Such a request carries the page's `Origin`: one that is not the server's own
  (nor a name given with `--allowed-host`) is refused, and every POST must say
  `Content-Type: application/json`, which a browser never sends cross-site without a preflight
  this server does not answer.

Then the body: one larger than `max_body` bytes gets 413 before it is parsed (by its
Content-Length at once, or as soon as a chunked body passes the limit), so no request makes the
server hold more than that.

Starlette's own `TrustedHostMiddleware` is not used: it answers a plain-text 400 where clients of
this server read OpenAI's JSON error object, it cuts an IPv6 Host (`[::1]:8080`) at its first
colon, and it has no Origin or body checks. Nor is there a Starlette middleware for body size; the
checks here are small, pure and tested directly (tests/test_server_guard.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .fields import ApiError

#: Names a server on this machine always answers to.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: Addresses that mean "every interface" when bound to.
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
MIB = 1 << 20
#: The default body limit's allowance per token of context: a token's text is 3-5 bytes on
#: average, and JSON escapes (\\uXXXX: six bytes a character) can multiply that.
BODY_BYTES_PER_TOKEN = 32


#: The default body limit's allowance for the rest of a request: tool lists and schemas (a large MCP
#: server's whole tool set is a few hundred KB; this keeps ten times that).
BODY_BASE = 4 * MIB


def default_max_body(n_ctx: int) -> int:
    """A body limit that holds a prompt of the whole context (`n_ctx` tokens, in the worst JSON
    escaping) plus BODY_BASE for the rest of the request, rounded up to whole MiB."""
    need = n_ctx * BODY_BYTES_PER_TOKEN + BODY_BASE
    return -(-need // MIB) * MIB


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (`name`, `name:port`, `[v6]`, `[v6]:port`) as (name, port): the name lower-cased
    without a trailing dot, the port None when absent; None when it is not a well-formed one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        port = rest[1:] if rest.startswith(":") else rest
        if not sep or (rest and not rest.startswith(":")):
            return None
    else:
        name, _, port = value.partition(":")
        name = name.rstrip(".")
    if not name or (port and not port.isdigit()):
        return None
    return name, int(port) if port else None


def _normal(name: str) -> str:
    """An address or name as Host headers give it: `[::1]` and `::1` alike, lower case."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host names (and so which origins) the server answers.

    `bound`: the address it listens on; `allowed`: the user's `--allowed-host` entries (a name, an
    address, `*.example.com` for a domain's names, or `*` for any: behind a proxy that checks
    itself); `local`: this machine's own addresses, taken as the bound address when `bound` is a
    wildcard."""

    bound: str = "127.0.0.1"
    allowed: tuple[str, ...] = ()
    local: frozenset[str] = frozenset()

    def __post_init__(self) -> None:  # written as Host headers give them, once
        object.__setattr__(self, "bound", _normal(self.bound))
        object.__setattr__(self, "allowed", tuple(_normal(a) for a in self.allowed))

    def host_ok(self, name: str) -> bool:
        """Whether a request whose Host names `name` (split_host's) is served."""
        if name in LOOPBACK_NAMES or self._given(name):
            return True
        if self.bound in WILDCARDS:
            return name in self.local
        return name == self.bound

    def origin_ok(self, origin: str, host_header: str) -> bool:
        """Whether a request with this `Origin` comes from the server's own page (same scheme-less
        host and port as its Host header) or from a name given with --allowed-host."""
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # `null` (a sandboxed frame, a file:// page), or no origin at all
        if self._given(_normal(parts.hostname)):
            return True
        default = 443 if parts.scheme == "https" else 80
        host = split_host(host_header)
        if host is None:
            return False
        return (_normal(parts.hostname), port or default) == (host[0], host[1] or default)

    def _given(self, name: str) -> bool:
        for pattern in self.allowed:
            if pattern == "*" or pattern == name:
                return True
            if pattern.startswith("*.") and name.endswith(pattern[1:]):
                return True
        return False


def machine_addresses() -> frozenset[str]:
    """This machine's own interface addresses (for a server bound to every interface)."""
    import psutil

    out: set[str] = set()
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family.name in ("AF_INET", "AF_INET6"):
                out.add(_normal(a.address.split("%")[0]))  # fe80::1%eth0: the zone is not in a Host
    return frozenset(out)


class RequestGuard:
    """ASGI middleware: the Host, Origin, Content-Type and body-size checks (module docstring).

    A refused request gets OpenAI's JSON error object with 403, 415 or 413 and one line saying what
    to change; the server keeps serving. A POST's body is read here, up to `max_body`, and handed on
    whole (every POST route reads all of it anyway)."""

    def __init__(self, app: ASGIApp, *, policy: HostPolicy, max_body: int) -> None:
        self.app = app
        self.policy = policy
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        err = self.refusal(scope["method"], headers)
        if err is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body, err = await self._read_body(receive)
            if err is None:
                receive = _replay(body, receive)
        if err is not None:
            await _send_error(err, scope, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: dict[str, str]) -> ApiError | None:
        """Why a request with these headers is refused before its body is read, or None."""
        host = headers.get("host")
        if host is not None:
            split = split_host(host)
            name = split[0] if split is not None else None
            if name is None or not self.policy.host_ok(name):
                return ApiError(
                    f"this server does not answer to the host {host!r}; start it with "
                    f"--allowed-host {name or 'NAME'} to serve that name",
                    status=403,
                    type="forbidden",
                    code="host_not_allowed",
                )
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_ok(origin, host or ""):
            return ApiError(
                f"requests from the web origin {origin!r} are refused: only this server's own page may "
                "call it from a browser (start it with --allowed-host NAME to trust that name's pages)",
                status=403,
                type="forbidden",
                code="origin_not_allowed",
            )
        if method in ("POST", "PUT", "PATCH"):
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return ApiError(
                    f"the body must be JSON sent as Content-Type: application/json (got "
                    f"{kind or 'no Content-Type'}; curl: -H 'Content-Type: application/json')",
                    status=415,
                    code="unsupported_media_type",
                )
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                return self._too_large(length)
        return None

    async def _read_body(self, receive: Receive) -> tuple[bytes, ApiError | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", None  # the route sees an empty body and the hang-up after it
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return b"", self._too_large(f"more than {size}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _too_large(self, length: str) -> ApiError:
        mib = self.max_body / MIB
        return ApiError(
            f"the request body is {length} bytes, over this server's limit of {mib:g} MiB "
            "(start it with a larger --max-body MIB)",
            status=413,
            code="request_too_large",
        )


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones)."""
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        out.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then the client's own messages (a hang-up)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _send_error(err: ApiError, scope: Scope, send: Send) -> None:
    """The refusal in OpenAI's error shape; the request's body, if any, is left unread."""
    from starlette.responses import JSONResponse

    response = JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    async def nothing() -> Message:  # the response never reads the request
        return {"type": "http.disconnect"}

    await response(scope, nothing, send)


def parse_allowed(values: Iterable[str]) -> tuple[str, ...]:
    """`--allowed-host` values, each checked (BadInput naming the bad one)."""
    from ..errors import BadInput

    out = []
    for v in values:
        name = _normal(v)
        if not name or any(c.isspace() or c in "/@?#" for c in name) or "*" in name.lstrip("*."):
            raise BadInput(
                f"--allowed-host {v!r} is not a host name", "give a name such as llm.example.com, *.lan, or *"
            )
        out.append(name)
    return tuple(out)
