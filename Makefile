# jaxcluster developer targets. `make help` lists them.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# zizmor (a dev extra) ships a binary, installed beside the interpreter's scripts.
ZIZMOR ?= $(dir $(shell command -v $(PYTHON)))zizmor
# `--release` makes `cargo test` share the release wheel's build (what .ci/run does).
CARGO_PROFILE ?=
# `make wheel` builds with its own virtualenv of maturin and zig, made on first use.
BUILD_VENV ?= .venv/build
BUILD_PY := $(BUILD_VENV)/bin/python
# The Linux wheels: manylinux2014 (glibc 2.17), linked by zig, no container needed.
WHEEL_ARCH ?= $(shell uname -m)
MATURIN_ZIG = PATH="$(CURDIR)/$(BUILD_VENV)/bin:$$PATH" $(BUILD_PY) -m maturin build --release \
	--zig --compatibility manylinux2014 --out dist

.DEFAULT_GOAL := help
.PHONY: help install demo test check test-rust test-python lint fmt docs bench bench-rust bench-python wheel wheels sdist

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

install: ## Build the wheel with maturin (release) and install it
	$(PIP) install .

demo: install ## Install, then run the demo on a local cluster
	$(PYTHON) -m jaxcluster demo

test: ## What CI runs: fresh virtualenvs (newest and lowest dependencies), lint, cargo test, pytest
	bash .ci/run

check: ## Quick: install into this environment with test extras, then cargo test and pytest
	$(PIP) install '.[test]'
	$(MAKE) test-rust test-python

test-rust: ## Rust unit, property and stress tests of the core (no interpreter needed)
	cargo test $(CARGO_PROFILE) --all-targets

test-python: ## Python tests against the installed package
	$(PYTHON) -m pytest -q

lint: ## rustfmt, clippy (pedantic), ruff, mypy (every call into _core checked), stubtest of _core.pyi, zizmor
	cargo fmt --check
	cargo clippy --all-targets --features python -- -D warnings
	$(PYTHON) -m ruff check python tests benches examples deploy
	$(PYTHON) -m ruff format --check python tests benches examples deploy
	$(PYTHON) -m mypy
	$(PYTHON) -m mypy.stubtest jaxcluster._core --allowlist .stubtest-allowlist
	$(ZIZMOR) --offline --quiet .github/workflows

docs: ## The documentation site: mkdocs build --strict, doc examples, headless-Chromium check (.ci/docs)
	DOCS_PYTHON=$(PYTHON) DOCS_SITE=$(CURDIR)/site bash .ci/docs

fmt: ## Format Rust and Python sources
	cargo fmt
	$(PYTHON) -m ruff format python tests benches examples deploy

bench: bench-rust bench-python ## All benchmarks

bench-rust: ## criterion: queue throughput and device-name parsing
	cargo bench

bench-python: ## Python-side ratios vs pure-Python / grpcio references (needs a release build)
	$(PYTHON) benches/queue_bench.py
	$(PYTHON) benches/device_bench.py
	$(PYTHON) benches/coordinator_bench.py
	$(PYTHON) benches/ps_bench.py
	$(PYTHON) benches/latency_bench.py  # add --ray-python PATH for Ray beside it (docs/benchmarks.md)

$(BUILD_PY):
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_PY) -m pip install -q --upgrade pip 'maturin>=1.9,<2' ziglang

wheel: $(BUILD_PY) ## Build the release wheel for this machine's arch into dist/ (manylinux2014 on Linux)
ifeq ($(shell uname -s),Linux)
	$(MATURIN_ZIG) --target $(WHEEL_ARCH)-unknown-linux-gnu
else
	$(BUILD_PY) -m maturin build --release --out dist
endif

wheels: $(BUILD_PY) ## Linux: manylinux2014 wheels for x86_64 and aarch64 into dist/
	rustup target add x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu
	$(MATURIN_ZIG) --target x86_64-unknown-linux-gnu
	$(MATURIN_ZIG) --target aarch64-unknown-linux-gnu

sdist: $(BUILD_PY) ## The source distribution into dist/
	$(BUILD_PY) -m maturin sdist --out dist
