"""The live page at `/`: what the server sends (any machine), and the page at work in a real headless
Chromium (marker `browser`, skipped without one) against a served tiny model: a typed prompt streams
coloured tokens and live figures, drafting switches off, the API key is asked for and kept out of
URLs, light and dark mode. Screenshots go to $SPECCHAT_SCREENSHOTS when set (the README's came from
the slow real-pair test here), else to the test's temporary folder."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specchat.decoding.events import LABELS, STYLES, Source
from specchat.models import loader
from specchat.server.page import legend_sources, render_page

from .cdp import Browser, find_chromium
from .serving import loaded_engine, serve_here, serving

SOURCES = {s.value for s in Source}
PROMPT = "Tell me a story about a cat"


def shots_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("SPECCHAT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def page_config(html: str) -> dict[str, object]:
    raw = re.search(r'<script id="specchat-config" type="application/json">(.*?)</script>', html, re.S)
    assert raw, "the page has no config"
    return json.loads(raw.group(1))


# --- what is served ---------------------------------------------------------------------------------------


def test_every_colour_of_the_legend_is_a_css_variable_in_each_theme():
    """A token source's colour (decoding/events.py's STYLES) is `--c-<colour>` on the page, defined
    three times: light, dark by the system's preference, dark by the user's choice."""
    html = render_page(model="m", api_key=False, drafter_sources=[])
    for colour in {c or "default" for c in STYLES.values()}:
        assert html.count(f"--c-{colour}:") == 3, colour


def test_the_page_is_served_without_a_key_and_holds_none(tiny_engine):
    with serving(tiny_engine, api_key="s3cret") as url:
        base = url.removesuffix("/v1")
        r = httpx.get(f"{base}/", timeout=10)
        assert httpx.get(f"{url}/models", timeout=10).status_code == 401  # the API still needs it
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    html = r.text
    assert "s3cret" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing from elsewhere: works offline
    cfg = page_config(html)
    assert cfg["api_key"] is True and cfg["model"] == "tiny" and cfg["drafting"] is True
    want = legend_sources([Source.DRAFT, Source.NGRAM])
    assert cfg["legend"] == [
        {"source": s.value, "label": LABELS[s], "colour": STYLES[s] or "default"} for s in want
    ]  # the terminal's legend: same labels, colours and order


def test_the_config_cannot_close_its_script_element():
    html = render_page(model="</script><script>alert(1)</script>", api_key=False, drafter_sources=[])
    assert "<script>alert(1)" not in html
    cfg = page_config(html)
    assert cfg["model"] == "</script><script>alert(1)</script>" and cfg["drafting"] is False
    assert [e["source"] for e in cfg["legend"]] == ["target"]


# --- in a browser -----------------------------------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    exe = find_chromium()
    if exe is None:
        pytest.skip(
            "no Chromium installed: the page test drives Debian's `chromium` package "
            "(apt-get install chromium chromium-driver), or set SPECCHAT_CHROMIUM to a Chrome binary"
        )
    return exe


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    with Browser(chromium, tmp_path / "profile") as b:
        yield b


def ask(b: Browser, text: str, *, max_tokens: int = 64, timeout: float = 60) -> None:
    """Type a prompt as a user does (focus, text, Enter) and wait for the answer's final figures."""
    b.js(f"document.getElementById('max-tokens').value = '{max_tokens}'")
    b.js("document.getElementById('stat-line').dataset.final = ''")
    b.js("document.getElementById('prompt').focus()")
    b.type(text)
    b.key("Enter", "Enter", 13, text="\r")
    b.wait_for("document.getElementById('stat-line').dataset.final === '1'", timeout)


def tokens(b: Browser, turn: int = -1) -> list[dict[str, str]]:
    return b.js(
        f"[...[...document.querySelectorAll('#log .turn')].at({turn}).querySelectorAll('.tok')]"
        ".map(e => ({source: e.dataset.source, colour: getComputedStyle(e).color, text: e.textContent}))"
    )


@pytest.mark.browser
def test_the_page_streams_coloured_tokens_and_live_figures(tiny_engine, browser, tmp_path):
    b = browser
    with serving(tiny_engine) as url:
        b.goto(url.removesuffix("/v1") + "/")
        legend = b.js(
            "[...document.querySelectorAll('#legend [data-source]')]"
            ".map(e => [e.dataset.source, e.textContent, getComputedStyle(e.firstChild).color])"
        )
        want = legend_sources([Source.DRAFT, Source.NGRAM])
        assert [(s, t) for s, t, _ in legend] == [(s.value, f"■ {LABELS[s]}") for s in want]
        swatch = {s: c for s, _, c in legend}
        assert len(set(swatch.values())) == len(swatch)  # one colour per source
        assert b.js("document.activeElement.id") == "prompt"  # ready to type

        b.js(
            "window.renders = 0; new MutationObserver((records) => { window.renders += records.length; })"
            ".observe(document.getElementById('stat-line'), {attributeFilter: ['data-final']})"
        )
        ask(b, PROMPT)
        toks = tokens(b)
        assert toks and {t["source"] for t in toks} <= SOURCES and "draft" in {t["source"] for t in toks}
        for t in toks:  # each token in its source's colour, the legend's
            assert t["colour"] == swatch[t["source"]], t
        stats = b.js("document.getElementById('stat-line').textContent")
        assert re.search(
            r"64 tokens · [\d.]+ tok/s · \d+% \(\d+/\d+\) acceptance · [\d.]+ tokens/target pass", stats
        )
        # each rendering of the figures sets data-final once: many while the answer streamed (one per
        # round), not only the final one
        assert b.js("window.renders") >= 10
        assert b.js("document.querySelector('#log .user').textContent") == PROMPT
        b.screenshot(shots_dir(tmp_path) / "page-light.png")

        b.key("d", "KeyD", 68, alt=True)  # Alt+D: drafting off, from the keyboard
        assert b.js("document.getElementById('drafting').checked") is False
        ask(b, "And then?")
        assert {t["source"] for t in tokens(b)} == {"target"}
        stats = b.js("document.getElementById('stat-line').textContent")
        assert "– acceptance" in stats and "1.00 tokens/target pass" in stats
        compare = b.js("document.getElementById('compare').textContent")
        assert re.search(r"with drafting [\d.]+ tok/s, without [\d.]+ tok/s", compare)
        assert b.js("document.querySelectorAll('#log .turn').length") == 2

        b.dark(True)
        background = b.js("getComputedStyle(document.body).backgroundColor")
        text = b.js("getComputedStyle(document.body).color")
        assert background == "rgb(13, 17, 23)" and text == "rgb(230, 237, 243)"
        dark_green = b.js(
            "getComputedStyle(document.querySelector('#legend [data-source=draft]').firstChild).color"
        )
        assert dark_green != swatch["draft"]  # the palette changes with the scheme
        b.screenshot(shots_dir(tmp_path) / "page-dark.png")
        b.dark(False)
        assert b.js("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"


@pytest.mark.browser
def test_the_page_asks_for_the_key_and_keeps_it_out_of_urls(tiny_engine, browser):
    b = browser
    with serving(tiny_engine, api_key="s3cret") as url:
        b.goto(url.removesuffix("/v1") + "/")
        b.js("document.getElementById('prompt').focus()")
        b.type(PROMPT)
        b.key("Enter", "Enter", 13, text="\r")
        note = b.wait_for("document.querySelector('#log .note.error')?.textContent")
        assert "API key" in note
        assert b.js("document.activeElement.id") == "api-key"  # the page takes the user to the field
        b.type("s3cret")
        ask(b, PROMPT)
        assert tokens(b)
        assert "s3cret" not in b.js("location.href")
        assert b.js("localStorage.getItem('specchat.apiKey')") is None  # not stored unless asked
        b.js("document.getElementById('remember-key').click()")
        assert b.js("localStorage.getItem('specchat.apiKey')") == "s3cret"
        b.goto(url.removesuffix("/v1") + "/")
        assert b.js("document.getElementById('api-key').value") == "s3cret"
        ask(b, "Again")  # the remembered key works after a reload
        assert tokens(b)


@pytest.mark.slow
@pytest.mark.browser
def test_the_page_on_the_real_pair(real_pair, browser, tmp_path):
    """The README's screenshot: the default pair (recommended draft + n-gram, auto k) on `make demo`'s
    code edit (the answer copies its input: n-gram drafts), served as `specchat serve` serves
    (generating on the thread that loaded the models)."""
    target, draft = real_pair
    cfg = loader.LoadConfig(target=str(target), drafts=(str(draft), "ngram"), ctx_size=2048)
    loaded = loader.load(cfg)
    prompt = (Path(__file__).parent / "perf" / "demo_edit.txt").read_text()

    def drive(url: str) -> set[str]:
        browser.goto(url.removesuffix("/v1") + "/")
        ask(browser, prompt, max_tokens=160, timeout=600)
        browser.screenshot(shots_dir(tmp_path) / "serve-page.png")
        return {t["source"] for t in tokens(browser)}

    try:
        sources = serve_here(loader.LoadedEngine(loaded), drive, model="qwen2.5-coder-1.5b")
    finally:
        loaded.close()
    assert "ngram" in sources and sources <= SOURCES


def test_loaded_engine_has_no_drafters_without_drafts(tiny_pair):
    with loaded_engine(tiny_pair[0]) as engine:
        html = render_page(model="m", api_key=False, drafter_sources=[d.source for d in engine.drafters])
    assert page_config(html)["drafting"] is False
