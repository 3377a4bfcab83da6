# gpuprobe: the two set-up commands of the README are `make demo` and `make test`.
# Both install what they need (Debian packages, a virtual environment, npm tools) and are safe to re-run.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := influxdb mosquitto libportaudio2 sox gcc chromium systemd faketime prometheus curl openssl
STAMP := $(VENV)/.installed

.PHONY: help demo test deps system-deps venv node sim proto lint typecheck unit clean

help:
	@echo "make demo       the whole system on one machine with simulated GPUs"
	@echo "make test       install what is needed, then lint + type check + all tests"
	@echo "make proto      regenerate the Python code of the wire contract (proto/)"
	@echo "make sim        compile the GPU simulator library (libnvidia-ml.so.1) and the agent's native sampler"
	@echo "make lint | typecheck | unit    the parts of make test"

deps: system-deps venv node sim

# Debian packages: only the missing ones, so a machine that has them needs no network. A Prometheus
# installed here is stopped and disabled as a system service (the tests start their own on free ports).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	  case " $$missing " in *" prometheus "*) \
	    $$SUDO systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true;; \
	  esac; \
	fi

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[agent,collector,sim,trainer,model,dev]'
	@touch $@

node: node_modules/.package-lock.json
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

sim: venv
	$(PY) -m gpuprobe.sim.build
	$(PY) -m gpuprobe.nvml.native

proto: venv
	$(PY) tools/protogen.py

lint: venv node
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/protogen.py --check
	cd proto && ../node_modules/.bin/buf lint

typecheck: venv
	$(PY) tools/typecheck.py

# Two workers: most tests wait on processes and sockets rather than compute; every test is isolated by
# port, directory and database (tests/README.md). Durations are printed so that a slow newcomer is
# visible in CI's log.
unit: deps
	$(VENV)/bin/pytest -q -n 2 --dist worksteal --durations=25

test: deps lint typecheck unit

demo: deps
	$(VENV)/bin/gpuprobe demo

clean:
	rm -rf build sim/native/build gpuprobe/nvml/native/build .mypy_cache .ruff_cache .pytest_cache
