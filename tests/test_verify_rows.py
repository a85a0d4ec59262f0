"""tests/perf/device/verify_rows.py in its smallest form on this CPU: the table of verify rows against
one-token decoding (a Q4_K probe model, two short contexts, up to 5 rows) and the cost of each width
(a tiny random model), written as JSON. On a Mac or a CUDA machine the same script runs at full size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specchat.llama import build

DEVICE = Path(__file__).resolve().parent / "perf" / "device"
if str(DEVICE) not in sys.path:
    sys.path.insert(0, str(DEVICE))

import verify_rows  # noqa: E402  (a script folder, imported as test_device_tools does)


def test_the_verify_rows_table_and_costs_come_out_on_a_cpu(tmp_path, capsys):
    assert verify_rows.main(["--quick", "--gpu-layers", "0", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| k | Q4_K (probe), 40 cells | Q4_K (probe), 80 cells |" in printed
    assert "V(k)/V(1), 40 cells" in printed
    doc = json.loads((tmp_path / "verify-rows.json").read_text())
    assert doc["contexts"] == [40, 80]
    assert [(r["model"], r["cells"], len(r["diff"])) for r in doc["rows"]] == [
        ("Q4_K (probe)", 40, 5),
        ("Q4_K (probe)", 80, 5),
    ]
    assert all(r["diff"][0] == 0.0 for r in doc["rows"])
    # the patched build rounds every width like one row (stock llama.cpp parts from 4 rows on x86)
    if build.installed_queue() is not None:
        assert doc["exact_to"] == 5
    assert doc["exact_to"] == min(r["exact_to"] for r in doc["rows"]) >= 1
    for curve in doc["cost"].values():
        assert len(curve) == 5 and curve[0] == 1.0 and all(v > 0 for v in curve)
