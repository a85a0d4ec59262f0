# specchat — set-up and everyday commands. `make demo` and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CMAKE_ARGS passes through to llama-cpp-python's build: CMAKE_ARGS="-DGGML_CUDA=on" make install
# gives a CUDA build; on macOS arm64 llama.cpp builds with Metal by default. The install ends with a
# self-check of the llama.cpp build (quantised matmuls in a child process); a build that crashes or
# computes wrong numbers is rebuilt once for this CPU (no -march=native, no AMX, no pip wheel cache).
export CMAKE_ARGS

.PHONY: install test test-slow lint demo bench stress clean

$(BIN)/specchat: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	@touch $@

# The llama.cpp build self-check (specchat/llama/buildcheck.py), once per venv and again until it passes.
$(VENV)/.buildcheck: $(BIN)/specchat
	$(BIN)/python -m specchat.llama.buildcheck install
	@touch $@

install: $(VENV)/.buildcheck

test: install
	$(BIN)/pytest -q

test-slow: install
	$(BIN)/pytest -q -m slow

# the slow reliability checks on the real pair: exactness audit, 20-turn soak with a memory bound
stress: install
	$(BIN)/pytest -q -s -m slow tests/test_real_pair.py

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

clean:
	rm -rf $(VENV) build dist *.egg-info
