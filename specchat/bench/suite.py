"""What `specchat bench` measures: the built-in prompt suite (or a JSONL file of prompts), prompts
tokenized for the target, and the configurations (plain, fixed k, auto) each prompt runs under."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput

DEFAULT_KS = (1, 2, 3, 5)


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    """One benchmark prompt. `category` groups prompts whose answers behave alike for drafting."""

    name: str
    category: str
    text: str
    #: a whole conversation (multi-turn revisions: "now add type hints and return it again"); when
    #: given it is what the chat template renders, and `text` is its last user message
    messages: tuple[tuple[str, str], ...] = ()

    def conversation(self) -> list[dict[str, str]]:
        """The messages the chat template renders for this prompt."""
        if self.messages:
            return [{"role": r, "content": c} for r, c in self.messages]
        return [{"role": "user", "content": self.text}]


_RENAME_CODE = '''def calc(lst, tax_rate=0.2):
    """Return the total price of the order, tax included."""
    subtotal = 0
    for entry in lst:
        subtotal += entry["price"] * entry["qty"]
    if not lst:
        return 0
    return round(subtotal * (1 + tax_rate), 2)


def describe(lst):
    total = calc(lst)
    names = ", ".join(entry["name"] for entry in lst)
    return f"{len(lst)} items ({names}): {total}"


def cheapest(lst):
    return min(lst, key=lambda entry: entry["price"])["name"]
'''


_TYPES_CODE = """class Inventory:
    def __init__(self, items):
        self.items = dict(items)

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def remove(self, name, count=1):
        left = self.items.get(name, 0) - count
        if left < 0:
            raise ValueError(f"only {self.items.get(name, 0)} {name} left")
        self.items[name] = left
        return left

    def most_common(self, n):
        return sorted(self.items.items(), key=lambda kv: kv[1], reverse=True)[:n]


def merge(a, b):
    out = Inventory(a.items)
    for name, count in b.items.items():
        out.add(name, count)
    return out
"""


#: The built-in suite: one or two prompts per kind of answer. Code edits copy most of their input, which
#: is where model-free n-gram drafts shine; chat and creative text are where they cannot.
SUITE: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "code",
        "code",
        "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals given as "
        "(start, end) tuples. Include a docstring and two usage examples.",
    ),
    BenchPrompt(
        "edit-rename",
        "edit",
        "Rename the function `calc` to `order_total` and the parameter `lst` to `items` everywhere in this "
        f"code. Reply with the complete updated code only.\n\n```python\n{_RENAME_CODE}```",
    ),
    BenchPrompt(
        "edit-types",
        "edit",
        "Add type hints to every function and method in this code. Reply with the complete code only."
        f"\n\n```python\n{_TYPES_CODE}```",
    ),
    BenchPrompt(
        "chat",
        "chat",
        "What is the difference between a process and a thread? Answer in a few short paragraphs.",
    ),
    BenchPrompt(
        "creative",
        "creative",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    ),
    BenchPrompt(
        "json",
        "structured",
        "Return a JSON array of four fictional employees. Each has the fields id, name, email, department "
        "and skills (a list of strings). Output only the JSON.",
    ),
    BenchPrompt(
        "french",
        "non-english",
        "Explique en quelques paragraphes, en français, comment fonctionne la photosynthèse.",
    ),
)


def _messages(value: object, where: str) -> tuple[tuple[str, str], ...]:
    """A prompt line's "messages", checked: (role, content) pairs ending with a user message."""
    if value is None:
        return ()
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok or value[-1]["role"] != "user":  # type: ignore[index]
        raise BadInput(
            f'{where}: "messages" must be a list of {{"role": system|user|assistant, "content": ...}} '
            "objects ending with a user message"
        )
    return tuple((m["role"], m["content"]) for m in value)  # type: ignore[union-attr]


def load_prompts(path: Path) -> list[BenchPrompt]:
    """Prompts from a JSONL file: one {"name": ..., "prompt": ..., "category"?: ...} object per line,
    or {"name": ..., "messages": [{"role": ..., "content": ...}, ...]} for a multi-turn conversation.

    Any problem is one BadInput naming the file and line, so a typo costs seconds, not a model load.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise BadInput(f"no such prompts file: {path}", "give a JSONL file of {name, prompt} lines") from None
    except IsADirectoryError:
        raise BadInput(f"{path} is a directory, not a prompts file") from None
    except OSError as exc:
        raise BadInput(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text", "give a JSONL file of {name, prompt} lines") from None
    out: list[BenchPrompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{where}: not valid JSON ({exc.args[0] if exc.args else exc})") from None
        if not isinstance(obj, dict):
            raise BadInput(f'{where}: expected an object like {{"name": ..., "prompt": ...}}')
        name, prompt, category = obj.get("name"), obj.get("prompt"), obj.get("category", "custom")
        messages = _messages(obj.get("messages"), where)
        if messages and prompt is None:
            prompt = next(c for r, c in reversed(messages) if r == "user")
        if not isinstance(name, str) or not name.strip():
            raise BadInput(f'{where}: "name" must be a non-empty string')
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadInput(f'{where}: "prompt" must be a non-empty string')
        if not isinstance(category, str):
            raise BadInput(f'{where}: "category" must be a string')
        if name in seen:
            raise BadInput(f"{where}: duplicate prompt name {name!r}")
        seen.add(name)
        out.append(BenchPrompt(name, category, prompt, messages))
    if not out:
        raise BadInput(f"no prompts in {path}", 'each line needs {"name": ..., "prompt": ...}')
    return out


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A prompt as the target's tokens (chat template applied by the caller)."""

    name: str
    category: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Config:
    """One way of decoding: which drafters (indices into the bench's drafter list) and how many tokens.

    `drafters == ()` is plain decoding; `k is None` is the cost-model planner (`-k auto`).
    """

    name: str
    drafters: tuple[int, ...] = ()
    k: int | None = 0
    #: decode as `--strict` does (greedy output equal to plain token for token): the exact mode's
    #: cost is measured next to the default's in the same run
    strict: bool = False

    @property
    def plain(self) -> bool:
        return not self.drafters

    @property
    def auto(self) -> bool:
        return bool(self.drafters) and self.k is None


def drafter_labels(names: Sequence[str]) -> list[str]:
    """Short, unique labels for drafters: file stems for paths, names otherwise."""
    labels: list[str] = []
    for name in names:
        label = Path(name).stem if name.lower().endswith(".gguf") else name
        base, n = label, 2
        while label in labels:
            label, n = f"{base}#{n}", n + 1
        labels.append(label)
    return labels


def default_configs(drafter_names: Sequence[str], ks: Sequence[int] = DEFAULT_KS) -> list[Config]:
    """Plain; each drafter alone at each fixed k and in auto; all drafters in auto when there are
    several; and that last auto again under `--strict`.

    Fixed k per drafter is what "the best fixed k in hindsight" is chosen from, so the auto planner can
    be judged against it on every prompt. The strict run shows, in the same run and audit, what
    token-for-token equality with plain decoding costs on this machine.
    """
    labels = drafter_labels(drafter_names)
    out = [Config("plain")]
    for i, label in enumerate(labels):
        out += [Config(f"{label} k={k}", (i,), k) for k in ks]
        out.append(Config(f"{label} auto", (i,), None))
    if len(labels) > 1:
        out.append(Config("auto (all)", tuple(range(len(labels))), None))
    if labels:
        last = out[-1]
        out.append(Config(f"{last.name} --strict", last.drafters, None, strict=True))
    return out


def parse_ks(text: str) -> tuple[int, ...]:
    """`--ks 1,2,3,5` -> (1, 2, 3, 5); an empty string means no fixed-k configurations."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            k = int(part)
        except ValueError:
            raise BadInput(f"--ks must be comma-separated numbers like 1,2,3,5 (got {text!r})") from None
        if not 1 <= k <= 64:
            raise BadInput(f"--ks values must be between 1 and 64 (got {k})")
        out.add(k)
    return tuple(sorted(out))
