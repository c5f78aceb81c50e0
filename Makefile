# jaxcluster developer targets. `make help` lists them.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# `--release` makes `cargo test` share the release wheel's build (what .ci/run does).
CARGO_PROFILE ?=

.DEFAULT_GOAL := help
.PHONY: help install demo test check test-rust test-python lint fmt bench bench-rust bench-python wheel

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

lint: ## rustfmt, clippy (pedantic), ruff, stubtest of _core.pyi
	cargo fmt --check
	cargo clippy --all-targets --features python -- -D warnings
	$(PYTHON) -m ruff check python tests benches
	$(PYTHON) -m ruff format --check python tests benches
	$(PYTHON) -m mypy.stubtest jaxcluster._core --allowlist .stubtest-allowlist

fmt: ## Format Rust and Python sources
	cargo fmt
	$(PYTHON) -m ruff format python tests benches

bench: bench-rust bench-python ## All benchmarks

bench-rust: ## criterion: queue throughput and device-name parsing
	cargo bench

bench-python: ## Python-side ratios vs pure-Python / grpcio references (needs a release build)
	$(PYTHON) benches/queue_bench.py
	$(PYTHON) benches/device_bench.py
	$(PYTHON) benches/coordinator_bench.py
	$(PYTHON) benches/ps_bench.py

wheel: ## Build a release wheel into dist/
	maturin build --release --out dist
