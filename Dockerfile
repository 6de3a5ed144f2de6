# One image for every chronolock process: `timesvc serve`, `leasewatch serve`,
# `lockctl schema ...` (the schema Job) and `lockctl` itself. Kubernetes picks
# the process with `command:`; the default CMD only prints the help.
#
# Build:  docker build -t chronolock:0.1.0 .
# Lint:   hadolint Dockerfile          (tests/k8s runs it in `make test`)
#
# PYTHON_BASE names the base of both stages: any Debian bookworm with CPython 3.11 on PATH as
# `python`, `python -m venv` and the `groupadd`/`useradd` tools. `make image-test` builds with
# podman from a base made locally with mmdebstrap (scripts/image_test.py), since no registry
# image can be pulled on the build machines.
# checkov cannot resolve a build argument in FROM; the default below is an exact version tag
# (tests/k8s/test_lint.py::test_dockerfile_shape checks it):
#checkov:skip=CKV_DOCKER_7:the base is ARG PYTHON_BASE, whose default is an exact version tag
ARG PYTHON_BASE=python:3.11.11-slim-bookworm

# ---- builder: a virtualenv with the project and its server + Cassandra extras
FROM ${PYTHON_BASE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# cassandra-driver ships manylinux wheels for CPython 3.11, so no compiler is needed.
RUN python -m venv /opt/chronolock
ENV PATH=/opt/chronolock/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY lockclient ./lockclient
COPY timesvc ./timesvc
COPY leasewatch ./leasewatch
# Installs the project (not editable) into the venv; pip byte-compiles it here,
# so the read-only runtime filesystem never needs to write .pyc files.
# DL3013 (pin versions) is ignored for this line only: it installs the local
# project, whose dependency ranges live in pyproject.toml, not a PyPI name.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir '.[server,cassandra]' \
    && lockctl --help >/dev/null \
    && timesvc --help >/dev/null \
    && leasewatch --help >/dev/null

# ---- runtime: the venv only; no compiler, no pip cache, no sources
FROM ${PYTHON_BASE}

LABEL org.opencontainers.image.title="chronolock" \
      org.opencontainers.image.description="Fair distributed locks over Apache Cassandra: timesvc, leasewatch, lockctl" \
      org.opencontainers.image.licenses="Apache-2.0"

# Numeric, non-root user so that Kubernetes `runAsNonRoot: true` can verify it.
RUN groupadd --system --gid 10001 chronolock \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin chronolock

COPY --from=builder /opt/chronolock /opt/chronolock

# Works with a read-only root filesystem: nothing is written outside /tmp
# (Kubernetes mounts an emptyDir there); HOME points there for libraries that
# want a cache directory.
ENV PATH=/opt/chronolock/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

WORKDIR /tmp
USER 10001:10001

# timesvc 8700, leasewatch 8710 (both configurable; informational only).
EXPOSE 8700 8710

# Kubernetes probes /healthz and /readyz itself, so the image has no HEALTHCHECK
# (a Docker HEALTHCHECK would also be one fixed command for several processes).
CMD ["lockctl", "--help"]
