"""The reference pages that repeat what the code defines, checked against the code, so a new sampling
setting, API keyword or token source that a page does not name fails here, saying what to add where.

- docs/python-api.md: `specchat.load`'s and `specchat.generate`'s signatures as written there, and its
  list of the sampling settings' keywords (decoding/settings.py's `SETTINGS`, in the table's order);
- docs/server-api.md: the request fields name every sampling setting, and the token sources table has
  one row per `events.Source` with its colour (`events.STYLES`);
- README.md's legend and docs/extending.md's list of the colours the page defines name every colour.

Pages are read as text, nothing is imported but the API's module and the two tables: fast."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specchat import api
from specchat.decoding.events import STYLES, Source
from specchat.decoding.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
SETTING_NAMES = [s.name for s in SETTINGS]


def page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under a markdown heading (`## Request fields`), up to the next heading of its level or
    above; fails naming the heading when the page has none."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.find(f"\n{heading}\n")
    assert start >= 0, f"no {heading!r} heading"
    rest = text[start + len(heading) + 2 :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.MULTILINE)
    return rest[: end.start()] if end else rest


def code_names(text: str) -> list[str]:
    """The `backticked` words of a text, in order."""
    return re.findall(r"`([a-z_][a-z0-9_]*)`", text)


def written(fn: Callable[..., Any]) -> str:
    """`fn`'s parameters as docs/python-api.md writes them: `a, *, b=None, **sampling`."""
    parts: list[str] = []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={p.default!r}")
    return ", ".join(parts)


@pytest.mark.parametrize("name", ["load", "generate"])
def test_python_api_signatures_are_the_functions(name: str) -> None:
    found = re.search(rf"`specchat\.{name}\((.*?)\)`", page("docs/python-api.md"), flags=re.DOTALL)
    assert found, f"docs/python-api.md no longer writes out `specchat.{name}(...)`'s signature"
    doc = re.sub(r"\s+", " ", found.group(1)).strip()
    code = written(getattr(api, name))
    assert doc == code, (
        f"docs/python-api.md writes `specchat.{name}({doc})`, the code is `specchat.{name}({code})`: "
        "write the code's, and say what a new keyword does"
    )


def test_stream_takes_what_generate_takes_as_the_page_says() -> None:
    assert written(api.stream) == written(api.generate)


def test_python_api_lists_every_sampling_keyword_in_the_tables_order() -> None:
    text = page("docs/python-api.md")
    found = re.search(r"by the names the HTTP API uses:(.*?)\n- ", text, flags=re.DOTALL)
    assert found, "docs/python-api.md no longer lists the sampling keywords 'by the names the HTTP API uses:'"
    listed = code_names(found.group(1))
    missing = [n for n in SETTING_NAMES if n not in listed]
    extra = [n for n in listed if n not in SETTING_NAMES]
    assert listed == SETTING_NAMES, (
        f"docs/python-api.md lists the sampling keywords {listed}; decoding/settings.py's SETTINGS is "
        f"{SETTING_NAMES}: add {missing or 'nothing'}, remove {extra or 'nothing'}, in the table's order"
    )


def test_server_api_request_fields_name_every_sampling_setting() -> None:
    fields = set(code_names(section(page("docs/server-api.md"), "## Request fields")))
    missing = [n for n in SETTING_NAMES if n not in fields]
    assert not missing, (
        f"docs/server-api.md's request fields do not name {missing} (decoding/settings.py's SETTINGS): "
        "add each with its range and what it does"
    )


def source_rows() -> dict[str, str]:
    """docs/server-api.md's token sources table: source -> colour as written."""
    table = section(page("docs/server-api.md"), "### Token sources")
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]*?) \|", table, flags=re.MULTILINE)
    assert rows, "docs/server-api.md's token sources table has no rows"
    return dict(rows)


def test_server_api_token_sources_table_is_events_sources_with_their_colours() -> None:
    rows = source_rows()
    for source in Source:
        colour = STYLES[source] or "none"
        assert source.value in rows, (
            f"docs/server-api.md's token sources table has no row for `{source.value}` (decoding/events.py's "
            f"Source.{source.name}): add | `{source.value}` | {colour} | what it means |"
        )
        assert rows[source.value] == colour, (
            f"docs/server-api.md gives `{source.value}` the colour {rows[source.value]!r}; "
            f"decoding/events.py's STYLES says {colour!r}"
        )
    stale = sorted(set(rows) - {s.value for s in Source})
    assert not stale, f"docs/server-api.md's token sources table has rows for {stale}: events.Source has none"


COLOURS = sorted({c for c in STYLES.values() if c})


def test_readme_legend_names_every_colour() -> None:
    missing = [c for c in COLOURS if f"**{c}**" not in page("README.md")]
    assert not missing, f"README.md's colour legend does not name {missing} (decoding/events.py's STYLES)"


def test_extending_lists_the_colours_the_page_defines() -> None:
    text = re.sub(r"\s+", " ", page("docs/extending.md"))
    found = re.search(r"a colour the page already defines \(([^)]*)\)", text)
    assert found, "docs/extending.md no longer says which colours the page already defines"
    assert sorted(code_names(found.group(1))) == COLOURS, (
        f"docs/extending.md says the page defines {code_names(found.group(1))}; decoding/events.py's "
        f"STYLES uses {COLOURS} (tests/test_page.py checks the page defines each)"
    )


def test_server_api_states_the_constraint_limits_in_force() -> None:
    """Every limit of decoding/bounds.py's Limits, and the body's depth, appear in server-api.md's
    table as the code has them: a changed limit cannot leave the page promising another."""
    from dataclasses import fields

    from specchat.decoding.bounds import DEFAULT_LIMITS
    from specchat.server.api import MAX_DEPTH

    text = page("docs/server-api.md")
    start = text.index("## Who may call it")
    section = text[start : text.index("\n## ", start + 1)]
    numbers = set(re.findall(r"\d[\d,]*", section))
    for f in fields(DEFAULT_LIMITS):
        value = f"{getattr(DEFAULT_LIMITS, f.name):,}"
        assert value in numbers, f"docs/server-api.md's limits table does not give {f.name} = {value}"
    assert f"{MAX_DEPTH}" in numbers, f"docs/server-api.md does not say the body may nest {MAX_DEPTH} levels"
