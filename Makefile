# lmsuite's entry points. Every target creates .venv when it is missing and installs into it.
# The suite runs on the newest supported Python (Colab's); the peers' pins need 3.11.
PYTHON_VERSION ?= 3.13
PYTHON ?= $(shell .ci/find_python $(PYTHON_VERSION))
PEERS_PYTHON ?= $(shell .ci/find_python 3.11)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.installed
# Run the suite on the host CPU with 8 virtual devices so sharding tests see a mesh.
# glibc malloc settings that keep XLA:CPU's per-step buffers mapped (lmsuite/training/
# host_malloc.py, which `lmsuite train/pretrain` apply to themselves; a test keeps them equal).
# Benchmarks run with them; the test suite runs with glibc's defaults, as CI did before.
HOST_MALLOC := MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=67108864
TEST_XLA_FLAGS := --xla_force_host_platform_device_count=8
TEST_ENV = JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 XLA_FLAGS="$(TEST_XLA_FLAGS)"
# The fast suite compiles far more than it runs (tiny models, a few steps each), and LLVM's
# optimisation of XLA:CPU's generated code was much of each compile: at -O0, six two-step
# `lmsuite train` tests took 134 s instead of 247 s, and the whole suite 45 minutes instead of 55
# (2026-12-06). The matmuls are Eigen's library calls either way; the elementwise code is not
# bitwise the default's, so every test compares runs made at one level, and the parity tests
# pass within their tolerances. Long runs are slower at -O0 (`lmsuite pretrain`: 810 s against
# 420 s): the slow suite's twins, the benchmarks and users keep XLA's default. Subprocess tests
# pass it on (tests/xla_flags.py).
FAST_SUITE_XLA_FLAGS := --xla_backend_optimization_level=0
ARGS ?=
# `make pretrain EXPERIMENT=t5_1_1_tiny` runs lmsuite/gin/experiments/t5_1_1_tiny.gin (model dir runs/<name>).
EXPERIMENT ?= default

.PHONY: install test test-all bench pretrain lint format clean parity lock

# The exact versions of constraints.txt (`make lock` rewrites it from fresh resolutions).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: TEST_XLA_FLAGS += $(FAST_SUITE_XLA_FLAGS)
test: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

test-all: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadfile -m '' tests

lint: $(STAMP)
	$(VENV)/bin/ruff check lmsuite tests benchmarks
	$(VENV)/bin/ruff format --check lmsuite tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format lmsuite tests benchmarks
	$(VENV)/bin/ruff check --fix lmsuite tests benchmarks

# Peers whose pins conflict with ours (HF's Flax BERT needs transformers 4.57.x) live in their own venv.
$(PEERS_STAMP): benchmarks/peers-requirements.txt
	test -x $(PEERS)/bin/python || $(PEERS_PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet -r benchmarks/peers-requirements.txt
	touch $(PEERS_STAMP)

bench: $(STAMP) $(PEERS_STAMP)
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/model_step.py --peer_python=$(PEERS)/bin/python
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/model_step.py --peer_python=$(PEERS)/bin/python --dtype=bfloat16
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/seq2seq_step.py --peer_python=$(PEERS)/bin/python
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/xlnet_step.py
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/electra_step.py
	JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/objective_statistics.py
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/data_pipeline.py --peer_python=$(PEERS)/bin/python
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/train_loop.py
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/train_loop.py --gin_file=experiments/t5_1_1_tiny.gin
	$(HOST_MALLOC) JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 $(PY) benchmarks/decode.py --peer_python=$(PEERS)/bin/python

pretrain: $(STAMP)
	$(PY) -m lmsuite.cli pretrain --gin_file=experiments/$(EXPERIMENT).gin $(ARGS)

clean:
	rm -rf $(VENV) $(PEERS) build *.egg-info

# The HF parity table of benchmarks/RESULTS.md: runs the converter tests and prints each family's max-abs-diff.
parity: $(STAMP)
	rm -f .parity.jsonl
	LMSUITE_PARITY_LOG=$(CURDIR)/.parity.jsonl $(TEST_ENV) $(PY) -m pytest -q -p no:randomly tests/convert
	$(PY) benchmarks/parity_table.py .parity.jsonl

# Re-resolves pyproject.toml's ranges on each supported Python in fresh venvs and writes the
# exact versions to constraints.txt (review the diff; the suite must pass on the new pins).
lock:
	set -e; for v in 3.11 3.12 3.13; do \
	  rm -rf build/lock-$$v; $$(.ci/find_python $$v) -m venv build/lock-$$v; \
	  build/lock-$$v/bin/pip install --quiet --upgrade pip; \
	  build/lock-$$v/bin/pip install --quiet '.[test]'; \
	  build/lock-$$v/bin/pip freeze --exclude lmsuite > build/freeze-py$$v.txt; \
	done
	$(shell .ci/find_python 3.13) .ci/lock.py constraints.txt build/freeze-py3.11.txt build/freeze-py3.12.txt build/freeze-py3.13.txt
	rm -rf build/lock-3.11 build/lock-3.12 build/lock-3.13
