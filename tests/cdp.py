"""A headless Chromium driven over its DevTools protocol, standard library only.

Chromium talks CDP over a pipe (`--remote-debugging-pipe`: it reads commands from fd 3 and writes
replies and events to fd 4, each a JSON text ended by NUL), so no WebSocket client, WebDriver or
matching chromedriver version is needed: fewer moving parts than Selenium, and nothing to download.
One page (target) is attached in flat mode; commands are sent to its session and answered in order.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Names Debian, Ubuntu and Google give the browser binary.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Flags for a quiet, private, offline-friendly headless run (no sandbox: CI runs as root).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)

#: Run as `python -c TRAMPOLINE READ_FD WRITE_FD BROWSER ARGS...`: the pipe on 3 and 4, then the browser.
TRAMPOLINE = (
    "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
    "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
)


def find_chromium() -> str | None:
    """The browser to drive: $SPECCHAT_CHROMIUM, else the first of NAMES on PATH."""
    given = os.environ.get("SPECCHAT_CHROMIUM")
    if given:
        return shutil.which(given)
    return next((p for p in map(shutil.which, NAMES) if p), None)


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page. Use as a context manager; `close()` ends the process."""

    def __init__(self, exe: str, profile: Path, *, width: int = 1200, height: int = 860) -> None:
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        out_r, out_w = os.pipe()  # Chromium writes on fd 4, we read
        # move the child's ends above 10 first, so putting them on 3 and 4 cannot overwrite each other
        child_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        for fd in (cmd_r, out_w):
            os.close(fd)
        args = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        # a Python trampoline puts the pipe ends on fds 3 and 4 and execs the browser (a POSIX shell
        # cannot name fds above 9, and preexec_fn is unsafe with the server threads running)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TRAMPOLINE, str(child_r), str(child_w), *args],
            pass_fds=(child_r, child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(child_r)
        os.close(child_w)
        self._send_fd, self._recv_fd = cmd_w, out_r
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.width, self.height = width, height

    def __enter__(self) -> Browser:
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the protocol ------------------------------------------------------------------------------------
    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = True, timeout: float = 30
    ) -> Any:
        """Send one command (to the page's session unless `session=False`) and return its result."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._send_fd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no reply from Chromium in time")
            ready, _, _ = select.select([self._recv_fd], [], [], left)
            if ready:
                chunk = os.read(self._recv_fd, 1 << 20)
                if not chunk:
                    raise CdpError(f"Chromium closed the pipe (exit code {self.proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    # --- what the tests do -----------------------------------------------------------------------------
    def goto(self, url: str, timeout: float = 30) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only)."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def type(self, text: str) -> None:
        """Type into the focused element, as a keyboard would (one input event for the text)."""
        self.call("Input.insertText", {"text": text})

    def key(self, key: str, code: str, key_code: int, *, alt: bool = False, text: str = "") -> None:
        """Press and release one key (`key_code`: the Windows virtual key code)."""
        base = {"key": key, "code": code, "windowsVirtualKeyCode": key_code, "modifiers": 1 if alt else 0}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", **base, **({"text": text} if text else {})})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def dark(self, on: bool) -> None:
        """Have the page see `prefers-color-scheme: dark` (or light)."""
        value = "dark" if on else "light"
        self.call(
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": value}]}
        )

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(CdpError, OSError):  # it may exit before it answers
                self.call("Browser.close", session=False, timeout=5)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._send_fd, self._recv_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
