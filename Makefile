# The README's quick start is exactly `make up` and `make test`; both work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests use: libfaketime (skewed clocks), a Java runtime (the local
# Cassandra 1.2 node), chromium (the leasewatch page test), libfiu's fiu-utils (I/O faults
# injected into one live lockctl process), openssl (throw-away certificates for the TLS tests).
DEBIAN_PACKAGES := faketime libfaketime chromium fiu-utils openssl

.PHONY: up test lint install system-deps bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[server,cassandra,dev]'
	touch $@

install: $(STAMP)

system-deps:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi; \
	  apt="$$SUDO apt-get -o DPkg::Lock::Timeout=600"; \
	  for try in 1 2 3; do \
	    $$apt update -qq && DEBIAN_FRONTEND=noninteractive $$apt install -y -qq --no-install-recommends $$missing >/dev/null && break; \
	    [ $$try = 3 ] && exit 1; echo "apt-get failed (another apt running?); retrying in 20 s"; sleep 20; \
	  done; \
	fi

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install system-deps lint
	$(PY) -m pytest

up: install
	$(PY) scripts/up.py

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .chronolock .pytest_cache .mypy_cache .ruff_cache
