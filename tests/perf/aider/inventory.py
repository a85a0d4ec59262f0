"""A small inventory module: the file aider edits in tests/perf/aider_edit.py's measurement."""

import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0
    tags: list = field(default_factory=list)


def load_items(path):
    with open(path) as f:
        rows = json.load(f)
    return [Item(r["name"], float(r["price"]), int(r.get("quantity", 0)), r.get("tags", [])) for r in rows]


def calc_total(items):
    total = 0.0
    for item in items:
        total += item.price * item.quantity
    return round(total, 2)


def find_by_tag(items, tag):
    return [item for item in items if tag in item.tags]


def cheapest(items, n=3):
    ordered = sorted(items, key=lambda item: item.price)
    return ordered[:n]


def restock(items, name, amount):
    for item in items:
        if item.name == name:
            item.quantity += amount
            return item
    raise KeyError(name)


def report(items):
    lines = []
    for item in sorted(items, key=lambda item: item.name):
        lines.append(f"{item.name:20} {item.quantity:5} x {item.price:8.2f}")
    lines.append(f"{'total':20} {calc_total(items):18.2f}")
    return "\n".join(lines)
