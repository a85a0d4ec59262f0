"""Reliability and safety of the real CLI process, on tiny GGUF models.

The CLI checks start `python -m specchat` as a subprocess, because what users see is what a process
does: exit codes, what lands on stdout and stderr, signals, closed pipes (a few checks that need no real
process use Typer's in-process runner, to keep the suite quick). Covered:
- every bad input a user can give (`BAD_INPUT_IDS`, run together in `bad_input_results`): non-zero
  exit, ONE line, no traceback;
- Ctrl-C (SIGINT) mid-generation: exit 130, the partial text and the stats line, no traceback;
- a reader that closes the pipe early: quiet exit, no BrokenPipe traceback;
- hostile chat templates inside a GGUF: the sandbox refuses, the user gets one line without internals;
- control characters from files and from model output are shown escaped, never sent raw;
- model references cannot climb out of the cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specchat.cli import app, render
from specchat.decoding.events import Source, Token
from specchat.errors import ModelFileError, SpecchatError
from specchat.llama.engine import LlamaModel, LoadOptions
from specchat.models import loader
from specchat.models.registry import resolve
from specchat.models.registry_toml import load_registry

from .tiny_models import write_tiny_llama, write_truncated

CLI = [sys.executable, "-m", "specchat"]
FAST = ["--threads", "1"]
#: How long a process may take before the test gives up on it as hung (a guard, not a measurement:
#: generous for a loaded 2-core CI machine running several of these at once).
QUICK_S = 20.0
#: Enough tokens that generation is still running when a test interrupts it (tiny pair: ~10 s).
LONG = ["-n", "3000", "--ctx-size", "4096", *FAST]


def private_env(home: Path) -> dict[str, str]:
    """The subprocess environment: private caches, a Hub address where nothing listens, no debug."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPECCHAT_DEBUG", "HF_HUB_OFFLINE", "COLUMNS")}
    env.update(
        SPECCHAT_HOME=str(home / "specchat"),
        HF_HOME=str(home / "hf"),
        HF_HUB_CACHE=str(home / "hf" / "hub"),
        HF_ENDPOINT="http://127.0.0.1:9",
        PYTHONIOENCODING="utf-8",
    )
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 60) -> Result:
    proc = subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_error_line(res: Result, needle: str) -> None:
    """The contract for every user error: non-zero, nothing on stdout, one `error:` line, no traceback."""
    assert res.returncode not in (0, 130), res
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert res.stdout == ""


@pytest.fixture
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return private_env(tmp_path_factory.mktemp("proc-home"))


# --------------------------------------------------------------------------------------------------------
# Bad input, run concurrently (each is its own process)

BAD_INPUT_IDS = [
    "unknown-model",
    "missing-path",
    "text-file-named-gguf",
    "gguf-cut-to-first-megabyte",
    "draft-with-other-tokenizer",
    "k-negative",
    "temp-negative",
    "top-p-2",
    "prompt-longer-than-ctx-64",
]
#: More one-line cases from this file, run in the same concurrent batch to keep the suite quick.
MORE_ONE_LINE_IDS = ["hostile-chat-template"]
EVIL_NAME = "evil\x1b]0;owned\x07\x1b[2J.gguf"


@pytest.fixture(scope="module")
def bad_input_results(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_target: Path,
    not_a_gguf: Path,
    tiny_incompatible: tuple[Path, Path],
) -> dict[str, tuple[Result, str]]:
    base = tmp_path_factory.mktemp("bad-input")
    env = private_env(base / "home")
    # a model bigger than 1 MiB, cut to its first MiB as a broken download would be
    big = write_tiny_llama(base / "big.gguf", seed=4, n_embd=128, n_layer=4)
    assert big.stat().st_size > 2 * 2**20
    cut = write_truncated(big, base / "cut.gguf", fraction=2**20 / big.stat().st_size)
    assert cut.stat().st_size == 2**20
    target = str(tiny_target)
    cases: dict[str, tuple[list[str], str]] = {
        "unknown-model": (["run", "llama-9000", "-p", "hi"], "unknown model 'llama-9000'"),
        "missing-path": (["run", str(base / "missing.gguf"), "-p", "hi"], "no such file"),
        "text-file-named-gguf": (["run", str(not_a_gguf), "-p", "hi"], "not a GGUF file"),
        "gguf-cut-to-first-megabyte": (["run", str(cut), "-p", "hi"], "truncated"),
        "draft-with-other-tokenizer": (
            ["run", str(tiny_incompatible[0]), "--draft", str(tiny_incompatible[1]), "-p", "hi"],
            "different tokenizers",
        ),
        "k-negative": (["run", target, "-k", "-1", "-p", "hi"], "-k/--draft-tokens"),
        "temp-negative": (["run", target, "--temp", "-1", "-p", "hi"], "--temp"),
        "top-p-2": (["run", target, "--top-p", "2", "-p", "hi"], "--top-p"),
        "prompt-longer-than-ctx-64": (
            ["run", target, "--no-draft", "--ctx-size", "64", "-p", "word " * 200],
            "--ctx-size",
        ),
    }
    assert list(cases) == BAD_INPUT_IDS
    hostile = write_tiny_llama(
        base / "hostile.gguf", seed=1, chat_template=HOSTILE_TEMPLATES["cycler-globals"]
    )
    cases["hostile-chat-template"] = (["run", str(hostile), "-p", "hi", "-n", "4"], "sandbox")
    workdir = base / "cwd"  # where a template that escaped the sandbox would `touch PWNED`
    workdir.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: more would only queue
        futures = {
            name: pool.submit(run_cli, [*args, *(FAST if args[0] == "run" else [])], env, workdir)
            for name, (args, _n) in cases.items()
        }
        results = {name: (futures[name].result(), cases[name][1]) for name in cases}
    assert not (workdir / "PWNED").exists()
    return results


@pytest.mark.parametrize("case", BAD_INPUT_IDS + MORE_ONE_LINE_IDS)
def test_bad_input_is_one_line(bad_input_results, case):
    res, needle = bad_input_results[case]
    assert_one_error_line(res, needle)


def in_process(*args: str) -> Result:
    """The CLI in this process (Typer's runner): for one-line checks that need no real process."""
    res = CliRunner().invoke(app, list(args))
    return Result(res.exit_code, res.stdout, res.stderr)


def test_control_characters_in_a_file_name_are_escaped_in_the_error(tmp_path):
    evil = tmp_path / EVIL_NAME
    evil.write_text("not a model\n")
    res = in_process("run", str(evil), "-p", "hi")
    assert_one_error_line(res, "not a GGUF file")
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert "evil\\x1b]0;owned\\x07\\x1b[2J.gguf" in res.stderr


def test_hostile_template_error_names_no_internals(bad_input_results):
    stderr = bad_input_results["hostile-chat-template"][0].stderr
    assert "__" not in stderr and "globals" not in stderr and "hostile.gguf" in stderr


# --------------------------------------------------------------------------------------------------------
# Interrupts and pipes


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_sigint_mid_generation_keeps_partial_text_and_stats(tiny_pair, env):
    target, draft = (str(p) for p in tiny_pair)
    proc = start(["run", target, "--draft", draft, "-p", "Tell me a story", *LONG], env)
    try:
        first = proc.stdout.read(1)  # generation has started: tokens are being written
        assert first, proc.stderr.read().decode()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=QUICK_S)
    finally:
        proc.kill()
    stderr = err.decode()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    text = (first + rest).decode("utf-8", errors="replace")
    assert text.strip(), "the partial answer was lost"
    stats = [line for line in stderr.splitlines() if "tokens/target pass" in line]
    assert len(stats) == 1 and "stopped: interrupted" in stats[0], stderr
    generated = int(stats[0].split(" tokens")[0])
    assert 0 < generated < 3000


def _swallowing_generation(n: int, interrupt_at: int):
    """Tokens; at `interrupt_at` a SIGINT arrives while code that swallows KeyboardInterrupt runs (as
    a finalizer or a C callback would: Python prints "Exception ignored" there and goes on)."""
    for i in range(n):
        if i == interrupt_at:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the handler runs here, in the main thread
            except KeyboardInterrupt:
                pass
        yield Token(65 + i % 26, chr(65 + i % 26), Source.TARGET)


def test_ctrl_c_stops_a_generation_even_where_its_keyboard_interrupt_was_swallowed():
    from specchat.decoding.loop import Tally

    before = signal.getsignal(signal.SIGINT)
    shown = render.consume(_swallowing_generation(1000, 3), None, Tally())
    assert shown.interrupted
    assert len(shown.ids) == 3  # what came before the Ctrl-C is kept, nothing after it
    assert signal.getsignal(signal.SIGINT) is before  # the command's handler is put back


def test_ctrl_c_reaches_a_generation_whose_parent_ignored_sigint():
    """A shell's background job, nohup or a supervisor may start specchat with SIGINT ignored;
    an explicit SIGINT must still stop the answer (and only during it)."""
    from specchat.decoding.loop import Tally

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:

        def gen():
            for i in range(1000):
                if i == 5:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)
                yield Token(66, "B", Source.TARGET)

        shown = render.consume(gen(), None, Tally())
        assert shown.interrupted and len(shown.ids) == 5
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_reader_closing_the_pipe_early_exits_quietly(tiny_pair, env):
    target, draft = (str(p) for p in tiny_pair)
    proc = start(["run", target, "--draft", draft, "-p", "Tell me a story", *LONG], env)
    try:
        assert len(proc.stdout.read(20)) == 20  # like `| head -c 20`
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(timeout=QUICK_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    for noise in ("Traceback", "BrokenPipe", "Exception ignored", "error:"):
        assert noise not in err, err


def test_consume_closes_the_generation_on_any_error_before_returning_control():
    """The generation's cleanup (cache trimming) must run inside consume, while the caller's models
    are still open: left to the garbage collector it ran after `loaded.close()` and crashed llama.cpp
    (use-after-free) when a closed pipe broke the stream."""
    cleaned: list[str] = []

    def generation():
        try:
            for i in range(100):
                yield Token(i, "x", Source.TARGET)
        finally:
            cleaned.append("cache trimmed")

    class ClosedPipe(render.TokenStream):
        def write(self, tok: Token) -> None:
            raise BrokenPipeError

    gen = generation()
    with pytest.raises(BrokenPipeError):
        render.consume(gen, ClosedPipe(Console(record=True), live=False), tally=None)
    assert cleaned == ["cache trimmed"]  # already done, not waiting for `gen` to be collected


def test_closed_pipe_with_json_output_exits_quietly(tiny_pair, env):
    target, draft = (str(p) for p in tiny_pair)
    proc = start(["run", target, "--draft", draft, "-p", "hi", "-n", "20", "--json", *FAST], env)
    try:
        proc.stdout.close()  # gone before the single JSON write
        err = proc.stderr.read().decode()
        proc.wait(timeout=QUICK_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


# --------------------------------------------------------------------------------------------------------
# Hostile chat templates

HOSTILE_TEMPLATES = {
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler-globals": "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "joiner-globals": "{{ joiner.__init__.__globals__ }}",
    "namespace-globals": "{{ namespace.__init__.__globals__['__builtins__'] }}",
    "lipsum-globals": "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "mutate-messages": "{% set _ = messages.append({'role': 'x'}) %}{{ messages }}",
}
BROKEN_TEMPLATES = {
    "syntax-error": ("{% for m in messages %}", "failed"),
    "raise-exception": ("{{ raise_exception('Only user and assistant roles are supported') }}", "roles"),
    "bad-arithmetic": ("{{ 1 / 0 }}", "failed"),
}


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("templates")


def load_with_template(directory: Path, name: str, template: str) -> LlamaModel:
    path = write_tiny_llama(directory / f"{name}.gguf", seed=1, chat_template=template)
    return LlamaModel(path, LoadOptions(n_ctx=128, threads=1))


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_template_is_refused_by_the_sandbox(template_dir, name):
    model = load_with_template(template_dir, name, HOSTILE_TEMPLATES[name])
    with model, pytest.raises(ModelFileError) as info:
        loader.chat_prompt(model, MESSAGES)
    message = str(info.value)
    assert "sandbox" in message and f"{name}.gguf" in message
    for internal in ("__", "<class", "subprocess", "os."):
        assert internal not in message, message


@pytest.mark.parametrize("name", list(BROKEN_TEMPLATES))
def test_broken_or_refusing_template_is_one_clear_error(template_dir, name):
    template, needle = BROKEN_TEMPLATES[name]
    model = load_with_template(template_dir, name, template)
    with model, pytest.raises(ModelFileError) as info:
        loader.chat_prompt(model, MESSAGES)
    assert needle in info.value.message and "\n" not in info.value.message
    assert info.value.hint and "--raw" in info.value.hint


def test_a_normal_template_still_renders(template_dir):
    """The guard must not refuse ordinary templates (the ChatML one the tiny models carry)."""
    from .tiny_models import CHATML_TEMPLATE

    with load_with_template(template_dir, "chatml", CHATML_TEMPLATE) as model:
        tokens, warning = loader.chat_prompt(model, MESSAGES)
        assert warning is None
        (im_start,) = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert tokens.count(im_start) == 3  # system, user, and the generation prompt
        assert model.detokenize(tokens).endswith("assistant\n")


def test_format_strings_in_templates_cannot_reach_attributes(template_dir):
    """str.format is another road to attributes: the sandbox's formatter blocks it (silently)."""
    template = "A{{ '{0.__class__}'.format(messages) }}{{ '{0.__class__.__mro__}'.format('') }}B"
    with load_with_template(template_dir, "format", template) as model:
        try:
            tokens, _ = loader.chat_prompt(model, MESSAGES)
        except SpecchatError as err:
            text = err.message
        else:
            text = model.detokenize(tokens)
    assert "class" not in text and "list" not in text and "object" not in text


def test_raw_skips_a_hostile_template(template_dir):
    """The error's hint (--raw) is true: without the template the model is usable."""
    with load_with_template(template_dir, "raw", HOSTILE_TEMPLATES["subclasses"]) as model:
        tokens, _ = loader.chat_prompt(model, MESSAGES, raw=True)
        assert model.detokenize(tokens) == "hi"


# --------------------------------------------------------------------------------------------------------
# Control characters from files and from model output


@pytest.mark.parametrize("live", [False, True])
def test_token_stream_shows_control_characters_escaped(live):
    console = Console(record=True, force_terminal=live, width=200, color_system=None)
    stream = render.TokenStream(console, live=live)
    for i, piece in enumerate(["ok ", "\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "tab\there\n", "end"]):
        stream.write(Token(i, piece, Source.TARGET))
    stream.end()
    out = console.export_text()
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in out
    assert "\\x1b[2J" in out and "\\x1b]0;title\\x07" in out and "\\x9b31m" in out
    assert "\\x09" not in out and "\\x0a" not in out and "here\nend" in out  # layout stays layout


def test_model_output_with_control_bytes_is_escaped_on_stdout(tiny_target, env):
    """A random tiny model at high temperature emits byte tokens such as ESC and BEL: none reach the
    terminal raw. (Deterministic: fixed seed, greedy-free sampling over all tokens.)"""
    args = ["run", str(tiny_target), "--no-draft", "-p", "hi", "-n", "400", "--temp", "3", "--top-k", "0"]
    res = run_cli([*args, "--top-p", "1", "--seed", "1", "--ctx-size", "512", *FAST], env)
    assert res.returncode == 0, res.stderr
    raw_controls = [c for c in res.stdout if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]
    assert raw_controls == []
    assert "\\x" in res.stdout, "the model emitted no control bytes; pick another seed"


# --------------------------------------------------------------------------------------------------------
# Model references cannot escape the cache

ESCAPING_REFS = [
    "hf:org/repo/../../x.gguf",
    "hf:org/repo/../../../etc/passwd.gguf",
    "hf:org/repo/sub/../../x.gguf",
    "hf:org/repo//etc/x.gguf",
    "hf:org/repo/./x.gguf",
    "hf:org/repo/..\\..\\x.gguf",
    "hf:org/repo/C:/x.gguf",
    "hf:../repo/x.gguf",
    "hf:org/../x.gguf",
    "hf:org/..:Q4_K_M",
    "hf:/etc/passwd.gguf",
    "hf:org--x/repo/x.gguf",
    "hf:org/repo:../../Q4",
    "org/..:Q4_K_M",
    "../..:Q4_K_M",
    "..:Q4_K_M",
]


@pytest.mark.parametrize("spec", ESCAPING_REFS)
def test_references_that_climb_out_of_the_cache_are_refused(spec):
    with pytest.raises(SpecchatError):
        resolve(spec, load_registry())


@pytest.mark.parametrize("command", ["pull", "run"])
def test_escaping_reference_on_the_command_line_is_one_line(command):
    res = in_process(command, "hf:org/repo/../../x.gguf", *(["-p", "hi"] if command == "run" else []))
    assert_one_error_line(res, "'..' parts are refused")
