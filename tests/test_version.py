"""The version: written once, in pyproject.toml; the package and `specchat --version` read it."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path

from typer.testing import CliRunner

import specchat
from specchat.cli import app

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared() -> str:
    return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])


def test_the_package_reports_the_version_pyproject_declares():
    assert specchat.__version__ == importlib.metadata.version("specchat") == declared()


def test_the_command_line_prints_it():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"specchat {declared()}"


def test_a_source_tree_never_installed_says_so_instead_of_a_number(monkeypatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    try:
        assert importlib.reload(specchat).__version__ == "0+unknown"
    finally:
        monkeypatch.undo()
        importlib.reload(specchat)
    assert specchat.__version__ == declared()
