# The README's quick start is exactly `make up` and `make test`; both work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests use: libfaketime (skewed clocks), a Java runtime (the local
# Cassandra 1.2 node), chromium (the leasewatch page test), libfiu's fiu-utils (I/O faults
# injected into one live process), openssl (throw-away certificates for the TLS tests); for
# tests/faults also util-linux (unshare, mount) and iproute2; prometheus for promtool (checks and
# unit-tests k8s/monitoring's alert rules; the package's server is not started: it has no init here).
DEBIAN_PACKAGES := faketime libfaketime chromium fiu-utils openssl util-linux iproute2 prometheus
# Servers of the locks bench/peers.py compares chronolock with (installed by `make bench`, not
# `make test`); their Python clients (kazoo, redis, psycopg) are in the dev extra.
BENCH_DEBIAN_PACKAGES := zookeeper redis-server postgresql-15 etcd-server
# `make image-test` (not part of `make test`: slow, needs root): podman with runc (crun refuses
# this machine's hybrid cgroups), mmdebstrap for a local Debian base (no registry is reachable).
IMAGE_DEBIAN_PACKAGES := podman runc mmdebstrap

# Installs the Debian packages named in $(1) that are missing (root, or password-less sudo).
define apt_install
	@missing=""; \
	for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(2) \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi; \
	  apt="$$SUDO apt-get -o DPkg::Lock::Timeout=600"; \
	  for try in 1 2 3; do \
	    $$apt update -qq && DEBIAN_FRONTEND=noninteractive $$apt install -y -qq --no-install-recommends $$missing >/dev/null && break; \
	    [ $$try = 3 ] && exit 1; echo "apt-get failed (another apt running?); retrying in 20 s"; sleep 20; \
	  done; \
	fi
endef

.PHONY: up test lint docs install system-deps bench-deps image-deps image-test bench soak sim mutation clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# What each target needs: `make up` the stack (lockctl and the two services on SQLite), `make test`
# (and lint, bench) everything, the Cassandra driver and the dev tools included. The library's
# own base install (`pip install chronolock`) is proven by tests/test_packaging.py.
UP_STAMP := $(VENV)/.installed-up

$(UP_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[cli,server]'
	touch $@

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[cli,server,cassandra,dev]'
	touch $@ $(UP_STAMP)

install: $(STAMP)

system-deps:
	$(call apt_install,$(DEBIAN_PACKAGES),command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless";)

bench-deps:
	$(call apt_install,$(BENCH_DEBIAN_PACKAGES))

image-deps:
	$(call apt_install,$(IMAGE_DEBIAN_PACKAGES))

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/): built with warnings as errors, so a broken link, a
# page missing from the nav or a setting missing from the generated reference fails `make test`.
# Offline: no web fonts, no plugin that fetches. DOCS_DIR is git-ignored; open its index.html.
# (NO_MKDOCS_2_WARNING: Material's end-of-life banner, printed on every build, is not a warning about the docs.)
DOCS_DIR ?= .chronolock/site
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(DOCS_DIR)

test: install system-deps lint docs
	$(PY) -m pytest

up: $(UP_STAMP)
	$(PY) scripts/up.py

bench: install bench-deps
	$(PY) -m bench

# Builds the Dockerfile with podman on a Debian bookworm base made here with mmdebstrap, then runs
# timesvc and leasewatch from the image read-only as 10001:10001 and probes them
# (scripts/image_test.py; a few minutes; removes what it made). IMAGE_TEST_ARGS=--keep keeps it.
image-test: install image-deps
	$(PY) scripts/image_test.py $(IMAGE_TEST_ARGS)

# The mixed-fault run of tests/faults for SOAK_SECONDS (default 10 minutes) with a fresh seed
# (printed; CHRONOLOCK_FAULT_SEED=... replays it), judged by the same checkers as in `make test`.
# The history, schedule, logs and report stay in SOAK_DIR (pytest prunes its own tmp dirs).
SOAK_SECONDS ?= 600
SOAK_DIR ?= .chronolock/soak
soak: install system-deps
	rm -rf $(SOAK_DIR)
	CHRONOLOCK_FAULT_DURATION=$(SOAK_SECONDS) CHRONOLOCK_FAULT_ACQUISITIONS=1000000000 \
	CHRONOLOCK_FAULT_SEED=$${CHRONOLOCK_FAULT_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} \
	$(PY) -m pytest tests/faults/test_mixed.py -s -p no:cacheprovider --basetemp=$(SOAK_DIR)

# The deterministic simulator (sim/): searches fresh random seeds until 100,000 simulated
# acquisitions and ends with "sim: N seeds, A simulated acquisitions, V violations". SIM_SEED=7
# replays one seed (prints "history sha256: ..."); SIM_ACQUISITIONS, SIM_SEEDS, SIM_SECONDS,
# SIM_PROFILE, SIM_JOBS, SIM_REPLAY and SIM_DURATION (a long horizon for one seed) are read from the
# environment (python -m sim --help).
sim: install
	$(PY) -m sim

# Mutation testing of the algorithm cores (issue 24; not part of `make test`): mutmut 3 as configured
# in pyproject's [tool.mutmut], judged by the cores' unit tests and tests/sim/test_mutation_judge.py;
# prints a score per module and every mutant not killed (triaged in docs/mutation-triage.md). The
# modules are judged by a seeded sample of 20 mutants each (MUTATION_SAMPLE=20; MUTATION_SAMPLE=all:
# ~4,900 mutants, many hours); MUTATION_JOBS=2 workers under nice. A fresh run: mutants/ is removed first.
mutation: install
	rm -rf mutants
	$(PY) scripts/mutation.py

clean:
	rm -rf mutants $(VENV) .chronolock .pytest_cache .mypy_cache .ruff_cache
