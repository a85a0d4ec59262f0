"""Whether the server's models can answer: a target split over RPC workers loses the layers a worker
held when that worker dies (their weights and K/V lived in its memory), and comes back once the models
are loaded anew.

The server worker (worker.py) keeps one `Availability`. A WorkerError during a job marks it lost: that
request and each later one get 503 `worker_unavailable` with the reason, until `revive` (given by
`serve`: it asks every worker first and closes nothing while one is still gone) loads the models again.
The worker tries before each request and every `REVIVE_SECONDS` while idle. If the old models were
closed and the new ones then failed to load, nothing can be answered any more: `broken`, until a
restart. Runs on the model thread only, like everything that touches the models.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from ..errors import WorkerError
from .fields import ApiError

#: How often an idle worker whose RPC worker was lost asks again whether it is back.
REVIVE_SECONDS = 5.0

M = TypeVar("M")


class Availability(Generic[M]):
    """Lost and broken state of the models, and their revival through `revive` (None: never revived,
    e.g. a target on this machine alone, which loses no worker)."""

    def __init__(self, revive: Callable[[], M] | None, log: Callable[[str], None]) -> None:
        self._revive = revive
        self._log = log
        #: why requests get 503 while a worker is gone; None while every layer is reachable
        self.lost: str | None = None
        #: the models were closed for a reload that then failed
        self.broken: str | None = None
        self._last = 0.0

    @property
    def reason(self) -> str | None:
        """What /health reports under `unavailable`; None while the models answer."""
        return self.broken or self.lost

    def worker_lost(self, exc: WorkerError) -> ApiError:
        """Mark the models lost after `exc`; the 503 for the request it ended."""
        self.lost = _lost_line(exc)
        self._last = time.monotonic()
        return unavailable(self.lost)

    def due(self) -> bool:
        """Whether an idle worker should ask again now whether a lost RPC worker is back."""
        return (
            self.lost is not None
            and self.broken is None
            and self._revive is not None
            and time.monotonic() - self._last >= REVIVE_SECONDS
        )

    def check(self) -> M | None:
        """Before a request: the revived models if a lost worker is back now, None if nothing changed;
        503 while the models still cannot answer."""
        revived = self.try_revive() if self.lost is not None and self.broken is None else None
        if self.reason is not None:
            raise unavailable(self.reason)
        return revived

    def try_revive(self) -> M | None:
        """The models loaded again if every RPC worker answers now (None: still gone, or broken)."""
        if self.lost is None or self._revive is None or self.broken is not None:
            return None
        self._last = time.monotonic()
        try:
            models = self._revive()
        except WorkerError as exc:  # still gone: nothing was touched
            self.lost = _lost_line(exc)
            return None
        except Exception as exc:  # the old models were closed and the new ones did not load
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.broken = (
                f"the models could not be loaded again after an RPC worker came back: {first} "
                "(restart specchat serve)"
            )
            self._log(f"error: {self.broken}")
            return None
        self.lost = None
        self._log("every RPC worker answers again: the models are loaded anew and serving")
        return models


def _lost_line(exc: WorkerError) -> str:
    """Why requests get 503 while an RPC worker is gone, and what brings the server back."""
    return f"{exc.message}; once `specchat worker` runs there again the server loads the target anew"


def unavailable(reason: str) -> ApiError:
    """503 while the models cannot answer (an RPC worker of the split target is gone)."""
    return ApiError(reason, status=503, type="server_error", code="worker_unavailable")
