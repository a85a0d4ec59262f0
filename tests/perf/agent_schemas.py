"""What real agents' tool schemas ask of a grammar: the figures behind decoding/bounds.py's limits.

Reads tests/data/agent-tool-schemas.json.gz (436 tools of 14 frameworks and MCP servers; how they were
collected: tests/data/README.md) and prints, over all of them, the largest of each quantity a limit
bounds, then the GBNF each converter writes for the schemas with the largest repetition counts:
llama-cpp-python's own (`json_schema_to_gbnf`, which spells every repetition out as nested groups) and
specchat's (llama/schema_gbnf.py, `{m,n}` repetitions).

    python tests/perf/agent_schemas.py
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llama_cpp.llama_grammar import json_schema_to_gbnf

from specchat.llama.schema_gbnf import schema_to_gbnf
from specchat.server.api import json_depth

DATA = Path(__file__).resolve().parents[1] / "data" / "agent-tool-schemas.json.gz"
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")


def walk(node: Any) -> Any:
    """Every JSON object inside `node` (iteratively)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            yield n
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def facts(schema: dict[str, Any]) -> dict[str, int]:
    objs = list(walk(schema))
    counts = [int(o[k]) for o in objs for k in COUNTS if isinstance(o.get(k), int | float)]
    patterns = [o["pattern"] for o in objs if isinstance(o.get("pattern"), str)]
    props = [len(o["properties"]) for o in objs if isinstance(o.get("properties"), dict)]
    quantifiers = [int(n) for p in patterns for n in re.findall(r"\{\s*(\d+)", p)]
    return {
        "bytes": len(json.dumps(schema, separators=(",", ":"))),
        "depth": json_depth(schema),
        "values": sum(1 for _ in walk(schema)) + sum(len(o) for o in objs),
        "properties in one object": max(props, default=0),
        "enum values": max((len(o["enum"]) for o in objs if isinstance(o.get("enum"), list)), default=0),
        "min/max Items/Length": max(counts, default=0),
        "pattern characters": max((len(p) for p in patterns), default=0),
        "pattern {m,n}": max(quantifiers, default=0),
    }


def gbnf_figures(convert: Any, schema: dict[str, Any]) -> str:
    started = time.perf_counter()
    try:
        text = convert(schema)
    except Exception as exc:  # the converter's own refusal
        return f"fails ({type(exc).__name__})"
    ms = (time.perf_counter() - started) * 1000
    depth = deepest = 0
    for c in re.sub(r'"(\\.|[^"\\])*"|\[(\\.|[^\]\\])*\]', "", text):
        depth += c == "("
        depth -= c == ")"
        deepest = max(deepest, depth)
    return f"{len(text):>9,} B, {deepest:>7,} groups deep, {ms:6.1f} ms"


def main() -> None:
    tools = json.loads(gzip.decompress(DATA.read_bytes()))
    rows = [(src, t["name"], t["parameters"]) for src, ts in tools.items() for t in ts]
    print(f"{len(rows)} tool schemas from {len(tools)} sources")
    table = {name: facts(p) for _, name, p in rows}
    keys = next(iter(table.values())).keys()
    for key in keys:
        name, best = max(table.items(), key=lambda kv: kv[1][key])
        print(f"  largest {key:<26} {best[key]:>9,}  ({name})")
    print("GBNF of the schemas with the largest counts: llama-cpp-python's converter | specchat's")
    biggest = sorted(rows, key=lambda r: -table[r[1]]["min/max Items/Length"])[:4]
    for _, name, schema in biggest:
        stock = gbnf_figures(lambda s: json_schema_to_gbnf(json.dumps(s)), schema)
        print(f"  {name:<28} {stock} | {gbnf_figures(schema_to_gbnf, schema)}")


if __name__ == "__main__":
    main()
