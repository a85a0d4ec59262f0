"""The chat: session logic with numpy fakes, the CLI through the runner, one tiny-GGUF run end to end.

The fakes' "chat template" wraps each message in role/end marker ids and tokenises text so that a fake
model's output ("<7><3>...") maps back to the same ids: re-rendering a conversation then reproduces
earlier turns token for token, as a real BPE template does for ordinary text, which is what makes
the KV-prefix arithmetic checkable exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from specchat.cli import app, render
from specchat.cli.render import export_svg
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.loop import FixedK
from specchat.decoding.session import Action, ChatSession, InputAssembler, Turn
from specchat.errors import BadInput, ContextFull
from specchat.models import loader

from .fakes import FakeModel

V = 40
ROLE = {"system": 37, "user": 38, "assistant": 39}
END = 36
runner = CliRunner()


def fake_tokenize(text: str) -> list[int]:
    return [int(m[1]) if m[1] else ord(m[0]) % 32 for m in re.finditer(r"<(\d+)>|.", text, re.S)]


def fake_render(messages: Sequence[dict[str, str]], n_ctx: int) -> tuple[list[int], str | None]:
    """A ChatML-like template over ids; raises ContextFull like loader.chat_prompt."""
    out: list[int] = []
    for m in messages:
        out += [ROLE[m["role"]], *fake_tokenize(m["content"]), END]
    out.append(ROLE["assistant"])
    if len(out) >= n_ctx:
        raise ContextFull(f"the prompt is {len(out)} tokens but the context window is {n_ctx}")
    return out, None


class Interrupting(FakeModel):
    """A FakeModel whose n-th decode call (counting from 1) raises KeyboardInterrupt, once."""

    def __init__(self, *args: object, interrupt_at: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.interrupt_at = interrupt_at

    def decode(self, tokens, logits_rows):  # type: ignore[no-untyped-def]
        if self.interrupt_at is not None and len(self.decode_calls) + 1 == self.interrupt_at:
            self.interrupt_at = None
            self.decode_calls.append((0, 0))  # count the attempt, so later calls keep their numbers
            raise KeyboardInterrupt
        return super().decode(tokens, logits_rows)


class FakeEngine:
    """chat.Engine over fakes; remembers every conversation it rendered."""

    def __init__(
        self, *, n_ctx: int = 4096, with_draft: bool = True, target_interrupt: int | None = None
    ) -> None:
        self.target = Interrupting(V, seed=1, n_ctx=n_ctx, name="target", interrupt_at=target_interrupt)
        table = self.target.table.copy()
        table[::3] += 2.0 * FakeModel(V, seed=2).table[::3]  # mostly agrees with the target
        self.draft = Interrupting(V, n_ctx=n_ctx, table=table, name="draft")
        self.drafters = [ModelDrafter(self.draft, p_min=0.0)] if with_draft else []
        self.rendered: list[list[dict[str, str]]] = []
        self.tie_margin = 0.0
        self.exact_rows = 0
        self.strict = False

    def render(
        self, messages: Sequence[dict[str, str]], *, template_kwargs: object = None
    ) -> tuple[list[int], str | None]:
        self.rendered.append([dict(m) for m in messages])
        return fake_render(messages, self.target.n_ctx)

    def planner(self, k: int | None) -> FixedK:
        return FixedK(3 if k is None else k)


def say(session: ChatSession, text: str) -> tuple[list[int], render.Shown]:
    """One turn, consumed the way the UI does it (no stream)."""
    ans = session.ask(text)
    return ans.prompt, render.consume(ans.events, None, ans.tally)


def new_target_tokens(model: FakeModel, since: int) -> int:
    """Tokens decoded by the first decode call after `since` calls: the turn's prompt processing."""
    return model.decode_calls[since][0]


# --- input -------------------------------------------------------------------------------------------


def test_input_assembler_joins_backslash_lines_and_quote_blocks():
    asm = InputAssembler()
    assert asm.feed("one \\") is None and asm.pending
    assert asm.feed("two") == "one \ntwo" and not asm.pending
    assert asm.feed('"""') is None and asm.pending
    assert asm.feed("def f():\\") is None  # inside a block a trailing backslash is text
    assert asm.feed("    return 1") is None
    assert asm.feed('"""') == "def f():\\\n    return 1"
    assert asm.feed("plain") == "plain"
    assert asm.feed("ends with an escaped \\\\") == "ends with an escaped \\\\"


# --- turns and KV reuse -------------------------------------------------------------------------------


def test_history_goes_through_the_template_and_turn_two_decodes_only_new_tokens():
    eng = FakeEngine()
    s = ChatSession(eng, system="be brief", k=3, max_tokens=12)
    p1, shown1 = say(s, "hello")
    calls_t, calls_d = len(eng.target.decode_calls), len(eng.draft.decode_calls)
    p2, shown2 = say(s, "and more")

    assert eng.rendered[-1] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": shown1.text},
        {"role": "user", "content": "and more"},
    ]
    assert p2[: len(p1) + len(shown1.ids)] == p1 + shown1.ids  # earlier turns render identically
    new = len(p2) - len(p1) - len(shown1.ids)
    assert new == len([END, ROLE["user"], *fake_tokenize("and more"), END, ROLE["assistant"]])
    # the target holds committed[:-1]: this turn's prefill is the new tokens, minus the last prompt
    # token (decoded with the first round), plus the previous answer's last token (never cached)
    assert shown2.stats.prefill_tokens == new
    assert new_target_tokens(eng.target, calls_t) == new
    # the draft catches up on the same tokens (plus the last one or two of the answer it never decoded)
    assert eng.draft.decode_calls[calls_d][0] <= new + 2
    assert s.records[1].stats.prefill_tokens < s.records[1].stats.prompt_tokens / 2


def test_second_turn_cost_does_not_depend_on_first_answer_length():
    prefill = []
    for n in (4, 30):
        eng = FakeEngine()
        s = ChatSession(eng, k=2, max_tokens=n)
        say(s, "hi")
        calls = len(eng.target.decode_calls)
        _, shown = say(s, "again")
        prefill.append((shown.stats.prefill_tokens, new_target_tokens(eng.target, calls)))
    assert prefill[0] == prefill[1]


@pytest.mark.parametrize("who", ["target", "draft"])
def test_ctrl_c_mid_answer_keeps_what_was_shown_and_caches_consistent(who):
    eng = FakeEngine()
    s = ChatSession(eng, k=3, max_tokens=40)
    # target: 1 prompt decode + 1 per round; draft: 1 prompt decode + about 3 per round
    model = eng.target if who == "target" else eng.draft
    model.interrupt_at = 4 if who == "target" else 10
    p1, shown = say(s, "tell me")
    assert shown.interrupted and 0 < len(shown.ids) < 40
    turn = s.turns[-1]
    assert turn.interrupted and turn.ids == shown.ids and turn.answer == shown.text
    assert s.records[-1].stats.stop_reason == "interrupted"
    committed = p1 + shown.ids
    assert list(eng.target.tokens) == committed[:-1]
    assert list(eng.draft.tokens) == committed[: len(eng.draft.tokens)]

    calls = len(eng.target.decode_calls)
    p2, shown2 = say(s, "go on")  # the next turn builds on the partial answer and reuses the caches
    assert not shown2.interrupted
    assert p2[: len(committed)] == committed
    assert shown2.stats.prefill_tokens == len(p2) - len(committed)
    assert new_target_tokens(eng.target, calls) == len(p2) - len(committed)


def test_interrupt_before_any_output_keeps_no_empty_answer():
    eng = FakeEngine(target_interrupt=1)  # during prompt processing
    s = ChatSession(eng, k=3, max_tokens=10)
    _, shown = say(s, "oops, typo")
    assert shown.interrupted and shown.ids == []
    assert s.turns == [] and len(s.records) == 1
    assert eng.target.tokens == ()
    _, shown = say(s, "the real question")
    assert eng.rendered[-1] == [{"role": "user", "content": "the real question"}]
    assert len(shown.ids) == 10


def test_a_template_warning_is_shown_once_not_every_turn(monkeypatch):
    eng = FakeEngine()
    plain = eng.render
    monkeypatch.setattr(eng, "render", lambda msgs, **_: (plain(msgs)[0], "the target has no chat template"))
    s = ChatSession(eng, k=2, max_tokens=4)
    notices = []
    for q in ("one", "two", "three"):
        ans = s.ask(q)
        notices.append(ans.notices)
        render.consume(ans.events, None, ans.tally)
    assert notices == [["the target has no chat template"], [], []]


# --- context overflow ------------------------------------------------------------------------------


def test_overflow_drops_oldest_turns_keeps_system_prompt_and_continues():
    eng = FakeEngine(n_ctx=160)
    s = ChatSession(eng, system="sys", k=2, max_tokens=16)
    trimmed = []
    for i in range(10):
        ans = s.ask(f"q{i} " + "x" * 8)
        trimmed.append([n for n in ans.notices if "dropped the" in n])
        shown = render.consume(ans.events, None, ans.tally)
        assert len(ans.prompt) + 16 <= 160  # the answer always has its room
        assert len(shown.ids) == 16
    assert not any(trimmed[:4]) and any(trimmed)
    assert all("system prompt is kept" in n for t in trimmed for n in t)
    # trimming frees a margin at once, so the very next turn does not trim (and re-prefill) again
    assert not any(trimmed[i] and trimmed[i + 1] for i in range(len(trimmed) - 1))
    assert s.first > 0
    msgs = eng.rendered[-1]
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert msgs[1]["content"] == s.turns[s.first].user  # oldest turns gone, order kept
    assert msgs[-1]["content"].startswith("q9")
    assert "q0 " in s.to_markdown()  # the transcript keeps everything


def test_message_too_long_alone_is_a_one_line_error():
    s = ChatSession(FakeEngine(n_ctx=64), max_tokens=8)
    with pytest.raises(ContextFull, match="does not fit"):
        s.ask("y" * 200)
    assert s.turns == [] and s.records == []


# --- commands --------------------------------------------------------------------------------------


def test_k_and_draft_commands_change_the_next_turn():
    eng = FakeEngine()
    s = ChatSession(eng, k=4, max_tokens=20)
    assert "2" in s.handle("/k 2").message
    _, shown = say(s, "a")
    assert shown.stats.drafted > 0 and max(shown.stats.k_history) <= 2
    s.handle("/k auto")
    assert s.k is None
    assert s.handle("/draft off").message.startswith("drafting off")
    calls = len(eng.draft.decode_calls)
    _, shown = say(s, "b")
    assert shown.stats.drafted == 0 and len(eng.draft.decode_calls) == calls
    assert set(shown.sources) == {"target"}
    s.handle("/draft on")
    _, shown = say(s, "c")
    assert shown.stats.drafted > 0
    assert [r.k for r in s.records] == ["2", "off", "auto"]
    for bad in ("/k x", "/k 99", "/k", "/draft maybe"):
        with pytest.raises(BadInput):
            s.handle(bad)


def test_draft_on_without_a_draft_model_is_refused():
    s = ChatSession(FakeEngine(with_draft=False))
    assert not s.draft
    with pytest.raises(BadInput, match="no draft model"):
        s.handle("/draft on")


def test_temp_changes_sampling_and_the_draft_cut_off():
    eng = FakeEngine()
    s = ChatSession(eng, max_tokens=8, seed=3)
    assert eng.drafters[0].p_min == 0.0  # -k auto: the planner's floor decides how far to draft
    s.handle("/k 3")
    assert eng.drafters[0].p_min == 0.75  # a fixed k: the greedy default
    assert "0.7" in s.handle("/temp 0.7").message
    assert s.params.temperature == 0.7 and eng.drafters[0].p_min == 0.5
    s.handle("/k auto")
    assert eng.drafters[0].p_min == 0.0
    _, shown = say(s, "sample something")
    assert len(shown.ids) == 8
    for bad in ("/temp -1", "/temp hot", "/temp inf"):
        with pytest.raises(BadInput):
            s.handle(bad)
    fixed = ChatSession(FakeEngine(), p_min=0.9)
    fixed.handle("/temp 1")
    assert fixed.engine.drafters[0].p_min == 0.9  # a cut-off the user chose stays


def test_system_reset_and_plain_actions():
    eng = FakeEngine()
    s = ChatSession(eng, k=2, max_tokens=5)
    assert s.handle("/system").message == "no system prompt"
    s.handle("/system You are terse.")
    say(s, "hi")
    assert eng.rendered[-1][0] == {"role": "system", "content": "You are terse."}
    assert "You are terse." in s.handle("/system").message
    s.handle("/reset")
    assert s.turns == [] and s.first == 0 and len(s.records) == 1  # /stats keeps the session
    say(s, "fresh")
    assert [m["role"] for m in eng.rendered[-1]] == ["system", "user"]
    s.handle("/system -")
    assert s.system is None
    assert s.handle("/help").action is Action.HELP
    assert s.handle("/stats").action is Action.STATS
    assert s.handle("/exit").action is Action.EXIT
    assert s.handle("/save pic.svg").action is Action.SAVE_SVG
    with pytest.raises(BadInput, match="unknown command /nope"):
        s.handle("/nope")


def test_save_markdown_and_json_with_per_token_sources(tmp_path):
    s = ChatSession(FakeEngine(), system="sys", k=3, max_tokens=10, names={"target": "t.gguf"})
    say(s, "first")
    say(s, "second")
    assert "2 turns" in s.handle(f"/save {tmp_path / 'c.md'}").message
    md = (tmp_path / "c.md").read_text()
    assert md.index("## System") < md.index("first") < md.index("second")
    assert s.turns[0].answer in md and "t.gguf" in md
    s.handle(f"/save {tmp_path / 'c.json'}")
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["target"] == "t.gguf" and doc["system"] == "sys"
    assert [t["user"] for t in doc["turns"]] == ["first", "second"]
    toks = doc["turns"][0]["tokens"]
    assert [t["id"] for t in toks] == s.turns[0].ids
    assert "".join(t["text"] for t in toks) == doc["turns"][0]["answer"]
    assert {t["source"] for t in toks} <= {"draft", "correction", "bonus", "target"} and toks
    assert doc["turns"][1]["stats"]["generated_tokens"] == 10
    with pytest.raises(BadInput, match="cannot write"):
        s.handle(f"/save {tmp_path / 'missing-dir' / 'c.md'}")


def test_export_svg_draws_each_source_in_its_colour(tmp_path):
    turn = Turn("Hi", ids=[1, 2, 3], pieces=["Hel", "lo", "!"], sources=["draft", "correction", "bonus"])
    path = tmp_path / "t.svg"
    export_svg(path, [turn], system="sys")
    svg = path.read_text()
    assert svg.startswith("<svg") and "Hel" in svg and "specchat" in svg
    fills = set(re.findall(r"fill: (#[0-9a-f]{6})", svg))
    assert len(fills) >= 4  # three sources + default text


# --- the CLI ---------------------------------------------------------------------------------------


class FakeLoaded:
    def __init__(self, engine: FakeEngine) -> None:
        self.target = engine.target
        self.drafters = engine.drafters
        self.warnings: list[str] = []
        self.draft_models: list[FakeModel] = []
        self.tie_margin = 0.0
        self.exact_rows = 0
        self.strict = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_loaded(monkeypatch: pytest.MonkeyPatch) -> FakeLoaded:
    """`specchat chat` on fakes: the loader returns them and renders with the fake template."""
    loaded = FakeLoaded(FakeEngine(n_ctx=2048))
    monkeypatch.setattr(loader, "load", lambda cfg, **_kw: loaded)
    monkeypatch.setattr(
        loader,
        "chat_prompt",
        lambda target, messages, raw=False, tools=None, template_kwargs=None: fake_render(
            messages, target.n_ctx
        ),
    )
    return loaded


def chat(*lines: str, args: Sequence[str] = ("-k", "3", "-n", "12")):
    return runner.invoke(
        app, ["chat", "fake.gguf", "--draft", "fake-draft.gguf", *args], input="\n".join(lines)
    )


def test_scripted_chat_runs_every_command(fake_loaded, tmp_path):
    res = chat(
        "/help",
        "hello \\",
        "over two lines",
        "/stats",
        "/k 2",
        "second question",
        "/draft off",
        "third",
        "/draft on",
        "/temp 0.5",
        "/system Be nice.",
        "//slash text is a message",
        "/nonsense",
        f"/save {tmp_path / 'c.json'}",
        f"/save {tmp_path / 'c.md'}",
        f"/save {tmp_path / 'c.svg'}",
        "/stats",
        "/reset",
        "/exit",
        "never read",
    )
    out = res.stdout
    assert res.exit_code == 0, res.output
    assert "legend:" in out and "/draft on|off" in out and "End a line with \\" in out  # /help
    assert "12 tokens" in out and "tokens/target pass" in out
    hint = [line for line in out.splitlines() if "unknown command /nonsense" in line]
    assert len(hint) == 1 and "/help" in hint[0]
    doc = json.loads((tmp_path / "c.json").read_text())
    users = [t["user"] for t in doc["turns"]]
    assert users == ["hello \nover two lines", "second question", "third", "/slash text is a message"]
    assert doc["system"] == "Be nice."
    assert {t["source"] for t in doc["turns"][2]["tokens"]} == {"target"}  # drafting was off
    assert (tmp_path / "c.md").read_text().count("## User") == 4
    assert (tmp_path / "c.svg").read_text().startswith("<svg")
    table_rows = [line for line in out.splitlines() if re.match(r"^[1-4] +(auto|off|\d) ", line)]
    assert len(table_rows) == 1 + 4  # /stats after turn 1, then after all four
    assert "acc/pass" in out and "prefill" in out
    assert "conversation cleared" in out
    assert fake_loaded.closed


def test_cli_ctrl_c_stops_the_answer_and_returns_to_the_prompt(fake_loaded, tmp_path):
    fake_loaded.target.interrupt_at = 5
    res = chat("first", "second", f"/save {tmp_path / 'c.json'}", "/exit", args=("-k", "2", "-n", "30"))
    assert res.exit_code == 0, res.output
    assert "stopped" in res.stdout and "stays in the conversation" in res.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    first, second = doc["turns"]
    assert first["interrupted"] and 0 < len(first["tokens"]) < 30
    assert not second["interrupted"] and second["stats"]["generated_tokens"] == 30
    # the partial answer is part of the conversation, and the caches were reused up to its end
    new = second["stats"]["prompt_tokens"] - first["stats"]["prompt_tokens"] - len(first["tokens"])
    assert second["stats"]["prefill_tokens"] == new


def test_cli_end_of_input_quits_cleanly_and_errors_stay_in_the_chat(fake_loaded):
    res = chat("/k nope", "/temp -2", "/save", "hi")
    assert res.exit_code == 0, res.output
    errors = [line for line in res.stdout.splitlines() if "error:" in line]
    assert len(errors) == 3
    assert "12 tokens" in res.stdout  # the chat went on after the errors


def test_cli_rejects_bad_options_before_loading(fake_loaded):
    res = chat(args=("-k", "-3"))
    assert res.exit_code == 2 and "-k/--draft-tokens" in res.stderr
    assert not fake_loaded.closed  # never loaded


def test_chat_end_to_end_with_tiny_gguf_pair(tiny_pair, tmp_path):
    target, draft = (str(p) for p in tiny_pair)
    lines = ["Hello there", "Tell me more", "/stats", f"/save {tmp_path / 'c.json'}", "/exit"]
    res = runner.invoke(
        app,
        # drafting forced: whether auto mode drafts with a draft as big as its target depends on
        # microsecond timings (tested with fakes in test_planner); here the colours and reuse matter
        ["chat", target, "--draft", draft, "-k", "2", "-n", "16", "--threads", "1", "--ctx-size", "512"],
        input="\n".join(lines),
    )
    assert res.exit_code == 0, res.output
    assert "accept" in res.stdout and "tokens/target pass" in res.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    t1, t2 = doc["turns"]
    assert t1["stats"]["generated_tokens"] == t2["stats"]["generated_tokens"] == 16
    assert "draft" in {t["source"] for t in t1["tokens"] + t2["tokens"]}
    # turn 2 reuses the cached first turn (at least the template and the first question)
    assert t2["stats"]["prefill_tokens"] < t2["stats"]["prompt_tokens"] - t1["stats"]["prompt_tokens"] + 1


def test_run_without_a_prompt_on_a_terminal_opens_the_chat(fake_loaded, monkeypatch):
    import typer.testing

    # the runner's stdin says it is a terminal (its stdout stays a pipe)
    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "isatty", lambda self: self.name == "<stdin>")
    res = runner.invoke(
        app, ["run", "fake.gguf", "--draft", "d.gguf", "-k", "2", "-n", "7"], input="hi\n/exit\n"
    )
    assert res.exit_code == 0, res.output
    assert "specchat chat" in res.stdout and "7 tokens" in res.stdout
    res = runner.invoke(app, ["run", "fake.gguf", "--json"], input="")
    assert res.exit_code == 2 and "no prompt given" in res.stderr  # --json wants a prompt
