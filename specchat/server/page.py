"""The live page at `/`: `static/index.html`, with this server's settings filled in.

The page is one self-contained file shipped in the package (no build step, nothing from a CDN). Its
colour legend is not written in the HTML but taken from `decoding.events`, as the terminal's is, so both
show the same labels in the same colours and order; a colour is a terminal colour name ("green"...)
that the page maps to a CSS variable readable in light and dark mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources

from ..decoding.events import LABELS, STYLES, Source, sources_for

PLACEHOLDER = "/*SPECCHAT_CONFIG*/"

#: Sent with the page: it runs its own inline script and talks to this server only.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def legend_sources(drafter_sources: Sequence[Source]) -> tuple[Source, ...]:
    """What `specchat run` would show for these drafters, plus plain target tokens when there are
    drafters (the page can switch drafting off)."""
    sources = sources_for(list(drafter_sources))
    return sources if Source.TARGET in sources else (*sources, Source.TARGET)


def config(*, model: str, api_key: bool, drafter_sources: Sequence[Source]) -> dict[str, object]:
    """What the page is told about this server: nothing secret (whether a key is needed, not the key)."""
    return {
        "model": model,
        "api_key": api_key,
        "legend": [
            {"source": s.value, "label": LABELS[s], "colour": STYLES[s] or "default"}
            for s in legend_sources(drafter_sources)
        ],
        "colours": {s.value: STYLES[s] or "default" for s in Source},
        "drafting": bool(drafter_sources),
    }


def render_page(*, model: str, api_key: bool, drafter_sources: Sequence[Source]) -> str:
    """The HTML to serve. The JSON goes inside a <script> element, so `<` is escaped (a model id
    cannot close the element)."""
    html = resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8")
    data = json.dumps(config(model=model, api_key=api_key, drafter_sources=drafter_sources))
    return html.replace(PLACEHOLDER, data.replace("<", "\\u003c"), 1)
