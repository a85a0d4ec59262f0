"""llama.cpp's reference program, run as a subprocess: found, driven with the same prompt text, parsed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from specchat.errors import BadInput
from specchat.llama.reference import PROGRAM, REFERENCE_MODES, find_program, run_reference


def fake_program(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / PROGRAM
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_missing_program_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(BadInput) as exc:
        find_program(tmp_path)
    assert PROGRAM in str(exc.value) and "--llama-cpp" in (exc.value.hint or "")


def test_speed_and_acceptance_are_parsed_and_the_prompt_file_is_the_same_text(tmp_path):
    seen = tmp_path / "seen.txt"
    fake_program(
        tmp_path,
        # copy the -f file so the test can check what llama.cpp was given; print its log format
        f'while [ "$1" != "-f" ]; do shift; done; cp "$2" {seen}\n'
        'echo "decoded  200 tokens in    5.000 seconds, speed:   40.000 t/s" >&2\n'
        'echo "accept   = 87.500%" >&2\n',
    )
    mode = REFERENCE_MODES["llama.cpp ngram-mod"]
    text = "<|im_start|>user\nhi<|im_end|>\n"
    run = run_reference(
        find_program(tmp_path), tmp_path / "t.gguf", text, mode, max_tokens=200, threads=2, ctx_size=4096
    )
    assert run.tokens_per_second == 40.0 and run.acceptance_rate == 0.875 and run.generated == 200
    assert seen.read_text() == "<|im_start|>user\nhi<|im_end|>\n"


def test_a_failing_reference_is_one_line(tmp_path):
    exe = fake_program(tmp_path, 'echo "error: unknown argument: --spec-type" >&2\nexit 1\n')
    with pytest.raises(BadInput) as exc:
        run_reference(exe, tmp_path / "t.gguf", "x", ("--spec-type", "ngram-mod"), max_tokens=8, threads=1,
                      ctx_size=512)  # fmt: skip
    assert "exit 1" in str(exc.value) and "unknown argument" in str(exc.value)
