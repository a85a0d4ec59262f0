"""A local stand-in for the Hugging Face Hub, and helpers to keep model tests off the network.

`StandinHub` is an http.server on 127.0.0.1 in a thread that speaks the few endpoints huggingface_hub
uses to download one file: `HEAD/GET /{org}/{repo}/resolve/{rev}/{file}` (with Range, ETag and
X-Repo-Commit), `GET /api/models/{org}/{repo}/revision/{rev}` and `GET /api/models/{org}/{repo}/tree/{rev}`.
Point huggingface_hub at it with HF_ENDPOINT. `cut_next_download_after(n)` makes the next GET send n
bytes and drop the connection, to test resuming within one pull; `drop_network_after(n)` does the same
and then keeps closing every connection unanswered (the network is gone) until `restore_network()`, to
test a later pull resuming. `bytes_served` counts the file bytes sent (counted before they are written, so
a client that has read them sees them counted), so tests can tell a resume from a restart.

`isolate()` points every cache (HF_HOME, HF_HUB_CACHE, SPECCHAT_HOME) and the registry (SPECCHAT_MODELS)
at a tmp dir and clears the variables that would change behaviour (HF_HUB_OFFLINE, HF_TOKEN). Test
modules call it from an autouse fixture: shared fixtures cannot go in tests/conftest.py here.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

COMMIT = "5f0e1c2d3b4a59687766554433221100ffeeddcc"


def tiny_gguf(payload_size: int = 256 * 1024, seed: int = 0) -> bytes:
    """A small file with a valid GGUF v3 header (one metadata key, no tensors) and seeded filler.

    Real GGUF parsing is not the point here; a GGUF-looking, non-trivial, reproducible payload is.
    """
    key, value = b"general.architecture", b"llama"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    header += struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    return header + random.Random(seed).randbytes(payload_size)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Seen:
    """One request as the stand-in saw it."""

    method: str
    path: str
    range: str | None


@dataclass
class StandinHub:
    """A fake Hub with files added by tests; use as a context manager (or start/stop)."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    bytes_served: int = 0
    down: bool = False
    _cut_after: int | None = None
    _down_after_cut: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def add(self, repo: str, filename: str, data: bytes) -> None:
        self.repos.setdefault(repo, {})[filename] = data

    def cut_next_download_after(self, n_bytes: int) -> None:
        """The next GET of a file sends n_bytes of the body and then closes the connection."""
        with self._lock:
            self._cut_after = n_bytes

    def drop_network_after(self, n_bytes: int) -> None:
        """The next GET of a file sends n_bytes and is cut; from then on every connection is closed
        without an answer (as when the network is gone) until restore_network()."""
        with self._lock:
            self._cut_after, self._down_after_cut = n_bytes, True

    def restore_network(self) -> None:
        with self._lock:
            self.down = False

    def take_cut(self) -> int | None:
        with self._lock:
            cut, self._cut_after = self._cut_after, None
            if cut is not None and self._down_after_cut:
                self.down, self._down_after_cut = True, False
            return cut

    def is_down(self) -> bool:
        with self._lock:
            return self.down

    def served(self, n_bytes: int) -> None:
        with self._lock:
            self.bytes_served += n_bytes

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)

    def downloads(self) -> list[Seen]:
        """GET requests for files (not metadata or listings)."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path]

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the stand-in first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> StandinHub:
        handler = type("BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="standin-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: later connections are refused, as when the Hub is unreachable."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StandinHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: StandinHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if self.hub.is_down():
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.hub.record(Seen(self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if path.startswith("/api/models/") and len(parts) >= 6:
            repo, kind = f"{parts[2]}/{parts[3]}", parts[4]
            if repo not in self.hub.repos:
                return self._error(404, "RepoNotFound", head=head)
            files = self.hub.repos[repo]
            if kind == "revision":
                return self._json(
                    {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}, head=head
                )
            if kind == "tree":
                return self._json(
                    [_tree_entry(name, data) for name, data in sorted(files.items())], head=head
                )
        elif path == "/api/models":
            return self._json([], head=head)  # specchat's reachability probe
        elif path == "/api/agent-harnesses":
            # huggingface_hub 2.x fetches this once per process for its user agent; it wants a dict.
            return self._json({"standardEnvVars": [], "harnesses": {}}, head=head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo, filename = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
            if repo not in self.hub.repos:
                return self._error(404, "RepoNotFound", head=head)
            data = self.hub.repos[repo].get(filename)
            if data is None:
                return self._error(404, "EntryNotFound", head=head)
            return self._file(data, head=head)
        return self._error(404, None, head=head)

    def _file(self, data: bytes, *, head: bool) -> None:
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and not head:
            first = wanted[len("bytes=") :].split("-", 1)[0]
            start, status = int(first or 0), 206
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha256_hex(data)}"')
        self.send_header("X-Repo-Commit", COMMIT)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        cut = self.hub.take_cut()
        # Counted before writing: once the client has read the bytes, a test may look at the count, and
        # the handler thread writing first could still be between its write and its count.
        if cut is not None:
            self.hub.served(min(cut, len(body)))
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.hub.served(len(body))
        self.wfile.write(body)

    def _json(self, payload: Any, *, head: bool) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, *, head: bool) -> None:
        body = json.dumps({"error": code or "not found"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if code:
            self.send_header("X-Error-Code", code)
        if code == "EntryNotFound":
            self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _tree_entry(name: str, data: bytes) -> dict[str, Any]:
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return {
        "type": "file",
        "path": name,
        "size": len(data),
        "oid": blob,
        "lfs": {"oid": sha256_hex(data), "size": len(data), "pointerSize": 134},
    }


# --------------------------------------------------------------------------------------------------------
# Environment isolation


@dataclass(frozen=True)
class Env:
    """The tmp locations one test uses."""

    root: Path
    hf_home: Path
    hub_cache: Path
    specchat_home: Path


def isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Env:
    """Point every cache at tmp_path and the Hub at a closed local port, so nothing reaches the network."""
    env = Env(
        root=tmp_path,
        hf_home=tmp_path / "hf",
        hub_cache=tmp_path / "hf" / "hub",
        specchat_home=tmp_path / "specchat",
    )
    monkeypatch.setenv("HF_HOME", str(env.hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(env.hub_cache))
    monkeypatch.setenv("SPECCHAT_HOME", str(env.specchat_home))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGINGFACE_HUB_CACHE", "SPECCHAT_MODELS"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub froze HF_HUB_OFFLINE at import; an outer HF_HUB_OFFLINE=1 must not leak into tests.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return env


def closed_port() -> int:
    """A local port nothing listens on (bound, then released), so connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_registry(path: Path, entries: dict[str, dict[str, Any]]) -> Path:
    """Write a models.toml with the given entries ({alias: fields}, a nested "mirror" dict allowed)."""
    lines = ["schema = 1", ""]
    for alias, fields in entries.items():
        lines.append(f'[models."{alias}"]')
        mirror = fields.get("mirror")
        lines += [f"{k} = {_toml(v)}" for k, v in fields.items() if k != "mirror"]
        if mirror:
            lines += ["", f'[models."{alias}".mirror]', *(f"{k} = {_toml(v)}" for k, v in mirror.items())]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


def model_fields(repo: str, file: str, data: bytes, **extra: Any) -> dict[str, Any]:
    """Registry fields for a test model served by the stand-in."""
    fields: dict[str, Any] = {
        "repo": repo,
        "file": file,
        "params": "1M",
        "quant": "Q4_1",
        "size": len(data),
        "family": "tiny",
        "context": 2048,
        "license": "apache-2.0",
        "sha256": sha256_hex(data),
    }
    fields.update(extra)
    return fields


def build_chunk_wheels(folder: Path, package: str, version: str, data: bytes, parts: int) -> list[Path]:
    """Wheels `{package.format(n=i)}-{version}-py3-none-any.whl` carrying data in `parts` chunks at
    `{module}/data/part{i:02d}.bin`, like the real mirror packages; minimal dist-info so pip accepts them."""
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(data) // parts)
    wheels = []
    for i in range(1, parts + 1):
        name = package.format(n=i)
        module = name.replace("-", "_")
        dist_info = f"{module}-{version}.dist-info"
        files = {
            f"{module}/__init__.py": b"",
            f"{module}/data/part{i:02d}.bin": data[(i - 1) * size : i * size],
            f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specchat-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
        }
        record = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
        wheel = folder / f"{module}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            for path, content in files.items():
                archive.writestr(path, content)
            archive.writestr(f"{dist_info}/RECORD", record)
        wheels.append(wheel)
    return wheels
