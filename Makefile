# specchat — set-up and everyday commands. `make demo` and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# llama-cpp-python is the pinned release with specchat's patch queue (patches/llama.cpp: verify batches
# round like one-token decoding) applied to its vendored llama.cpp, built once into a wheel cache
# (~/.cache/specchat/llama-cpp-python; about 15 minutes on 2 cores) and reinstalled from there.
# CMAKE_ARGS passes through to that build: CMAKE_ARGS="-DGGML_CUDA=on" make install gives a CUDA build;
# on macOS llama.cpp builds with Metal, and takes the queue's Metal patch too (built again without it,
# should that fail). The install ends with a self-check of the build
# (quantised matmuls in a child process, then the batch-invariance probe); a build that crashes or
# computes wrong numbers is rebuilt once for this CPU (no -march=native, no AMX, no cached wheel).
export CMAKE_ARGS
PATCHES := $(wildcard patches/llama.cpp/*.patch)

.PHONY: install test test-slow test-aarch64 lint demo bench stress verify-rows clean

$(BIN)/specchat: pyproject.toml $(PATCHES) specchat/llama/build.py specchat/llama/patchqueue.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -m specchat.llama.build install
	$(BIN)/pip install -e '.[dev]'
	@touch $@

# The llama.cpp build self-check (specchat/llama/buildcheck.py), once per build and again until it passes.
$(VENV)/.buildcheck: $(BIN)/specchat
	$(BIN)/python -m specchat.llama.buildcheck install
	@touch $@

install: $(VENV)/.buildcheck

test: install
	$(BIN)/pytest -q

test-slow: install
	$(BIN)/pytest -q -m slow

# ARM CPUs, checked on this x86 machine: the queue cross-compiled for aarch64 and run under qemu-aarch64
# (-cpu max: dotprod, i8mm, SVE): the ARM kernel tests, the batch-invariance probe (its verdict line is
# printed), and greedy speculative decoding against plain decoding on the tiny models. Installs Debian's
# cross compilers and qemu-user with apt-get when missing; the build and the aarch64 CPython are cached
# in ~/.cache/specchat/aarch64. About 4 minutes to build once, 25-35 emulated on 2 cores (docs/aarch64.md).
test-aarch64: install
	$(BIN)/python -m tests.aarch64.run

# the slow reliability checks on the real pair: exactness audit, 20-turn soak with a memory bound; then
# hostile requests for minutes: the server reproductions and freshly drawn fuzzed bodies against the tiny
# pair (3,000) and the real one (SPECCHAT_FUZZ_REAL_EXAMPLES, 60 by default: it generates ~100x slower)
stress: install
	$(BIN)/pytest -q -s -m slow tests/test_real_pair.py
	SPECCHAT_FUZZ_EXAMPLES=3000 SPECCHAT_FUZZ_RANDOM=1 $(BIN)/pytest -q -m "slow or not slow" tests/test_server_fuzz.py

lint: install
	$(BIN)/ruff check specchat tests
	$(BIN)/ruff format --check specchat tests

DEMO_PROMPT := Write a Python function that checks whether a string is a palindrome, with a docstring and two doctests.

# The default: the recommended draft model and n-gram lookup, routed per round by the cost model, on an
# edit (the answer copies its input: magenta = n-gram drafts the target accepted); then drafting with the
# draft model forced (-k 3: green = the draft was right; on a small CPU that is slower than plain decoding).
demo: install
	$(BIN)/specchat pull qwen2.5-coder-1.5b qwen2.5-coder-0.5b
	@echo "== specchat run (the defaults) on a code edit =="
	$(BIN)/specchat run qwen2.5-coder-1.5b --temp 0 --max-tokens 160 < tests/perf/demo_edit.txt
	@echo "== the draft model with drafting forced (-k 3): green = the draft was right =="
	$(BIN)/specchat run qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --temp 0 --max-tokens 160 -k 3 -p "$(DEMO_PROMPT)"

# plain vs fixed k vs auto vs n-gram, side by side on the default pair, with the exactness audit
bench: install
	$(BIN)/specchat pull qwen2.5-coder-1.5b qwen2.5-coder-0.5b
	$(BIN)/specchat bench qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft ngram \
		--max-tokens 128 --repeats 3 --ks 1,3,8 --save bench.json

# verify batches against one-token decoding on this build and device (Metal, CUDA or the CPU) at 300 and
# 1,500 KV cells, and what each width costs: tests/perf/device/verify_rows.py (GGUF=MODEL.gguf to check
# a model of your own; without it, the install probe's tiny models and a random 1B-shaped model)
verify-rows: install
	$(BIN)/python tests/perf/device/verify_rows.py $(GGUF)

clean:
	rm -rf $(VENV) build dist *.egg-info
