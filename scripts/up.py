"""`make up`: the local stack on the embedded SQLite store, in the foreground.

Starts three timesvc replicas and one leasewatch on one SQLite file, prints where
they listen and the ``export`` lines for clients, and stops everything cleanly on
Ctrl-C / SIGTERM. Ports: CHRONOLOCK_UP_PORT (default 8701) and the next three.

The store is ``CHRONOLOCK_STORE_URL`` if set, else ``.chronolock/cells.db`` in the
clone (this stack is the one place that creates a store's directory). What it prints
names files by absolute path, so the lines work pasted into a shell in any directory:
clients refuse to run without a store URL and to resolve a relative SQLite path
against their own working directory.

Revocation over HTTP (leasewatch's ``POST /revoke/{id}``) is refused by leasewatch unless
``LEASEWATCH_ADMIN_TOKENS`` is set. This stack listens on 127.0.0.1 only, so it enables it: a
fresh admin token (named ``local``) each start, written to ``.chronolock/admin-token`` (mode
0600, readable by this user only) and never printed. A ``LEASEWATCH_ADMIN_TOKENS`` of your own
in the environment is used instead. ``lockctl revoke`` needs none of this: it revokes on the
store directly (docs/lockctl-admin.md).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.path.abspath(sys.executable)).parent  # not resolve(): the venv's bin, not the interpreter's
STATE = ROOT / ".chronolock"


def absolute_store_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute (against this directory, once): the
    services, and every client that pastes the printed line, then name the same file."""
    scheme, sep, rest = url.partition(":///")
    if scheme.lower() == "sqlite" and sep and not rest.startswith("/"):
        return f"sqlite:///{Path.cwd() / rest}"
    return url


def log_tail(path: Path, lines: int = 5) -> str:
    """The last lines of a service's log: why it stopped (a refused setting says so in one line)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now — judged the way uvicorn binds.

    uvicorn listens through asyncio's ``create_server``, which sets ``SO_REUSEADDR`` on
    POSIX: connections of a previous run still in TIME_WAIT on the port do not stop it.
    A bind without that option fails on them for up to a minute (Linux's 60 s TIME_WAIT)
    after a restart, so the check binds with the same option; a port some process
    listens on is refused either way.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def local_admin_token(state: Path) -> str:
    """A fresh admin token for this stack's leasewatch, in ``state/admin-token`` (0600)."""
    token = secrets.token_urlsafe(32)
    path = state / "admin-token"
    # Created 0600 under a name of its own, then renamed over the old one: never readable by
    # others, not even for a moment, and two stacks starting at once do not trip over each other.
    tmp = state / f".admin-token.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def main() -> int:
    STATE.mkdir(exist_ok=True)
    store_url = absolute_store_url(os.environ.get("CHRONOLOCK_STORE_URL") or f"sqlite:///{STATE / 'cells.db'}")
    base = int(os.environ.get("CHRONOLOCK_UP_PORT", "8701"))
    plan: list[tuple[str, list[str], dict[str, str], int]] = []
    for i in range(3):
        port = base + i
        env = {
            "TIMESVC_PORT": str(port),
            "TIMESVC_REPLICA_ID": f"timesvc-{i + 1}",
            "TIMESVC_REPLICAS": "3",
            "TIMESVC_LOG_FORMAT": "console",
        }
        plan.append((f"timesvc-{i + 1}", [str(BIN / "timesvc"), "serve"], env, port))
    lw_env = {
        "LEASEWATCH_PORT": str(base + 3),
        "LEASEWATCH_REPLICA_ID": "leasewatch-1",
        "LEASEWATCH_LOG_FORMAT": "console",
        # The page's time panel polls each replica's /status.
        "LEASEWATCH_TIMESVC_URLS": ",".join(f"http://127.0.0.1:{base + i}" for i in range(3)),
    }
    own_admin_tokens = bool(os.environ.get("LEASEWATCH_ADMIN_TOKENS") or os.environ.get("LEASEWATCH_ADMIN_TOKEN"))
    if not own_admin_tokens:
        # Listening on 127.0.0.1 only: revocation over HTTP is enabled with a token only this
        # user can read (leasewatch refuses POST /revoke without LEASEWATCH_ADMIN_TOKENS).
        lw_env["LEASEWATCH_ADMIN_TOKENS"] = f"local:{local_admin_token(STATE)}"
    plan.append(("leasewatch", [str(BIN / "leasewatch"), "serve"], lw_env, base + 3))
    busy = [port for *_, port in plan if not port_is_free(port)]
    if busy:
        print(f"ports {busy} are in use; set CHRONOLOCK_UP_PORT to another base port", file=sys.stderr)
        return 1

    children: list[tuple[str, subprocess.Popen[bytes], int]] = []
    logs = STATE / "logs"
    logs.mkdir(exist_ok=True)

    def stop(*_: object) -> None:
        for _, proc, _ in children:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10  # 10 s for all of them, not 10 s each
        for name, proc, _ in children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop in 10 s; killing it", file=sys.stderr)
                proc.kill()

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C stops everything however this was started: a command run in the background of a
    # non-interactive shell (`... &` in a script, a CI runner) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler — SIGINT did nothing, and a test's SIGINT found the
    # stack still up 30 s later (its children were left running when it was killed).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for name, command, extra, port in plan:
            env = {**os.environ, "CHRONOLOCK_STORE_URL": store_url, **extra}
            log = (logs / f"{name}.log").open("ab")
            children.append((name, subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), port))
        deadline = time.monotonic() + 30
        for name, proc, port in children:
            while True:
                if proc.poll() is not None:
                    log_path = logs / f"{name}.log"
                    print(f"{name} exited; see {log_path}:\n{log_tail(log_path)}", file=sys.stderr)
                    stop()
                    return 1
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    print(f"{name} not ready after 30 s; see {logs / (name + '.log')}", file=sys.stderr)
                    stop()
                    return 1
                time.sleep(0.1)
        print(f"chronolock is up on {store_url}")
        for name, _, port in children:
            what = (
                "(the page at /, /locks, /metrics, /docs)"
                if name == "leasewatch"
                else "(GET /now, /status, /metrics, /docs)"
            )
            print(f"  {name:<12} http://127.0.0.1:{port}   {what}")
        urls = ",".join(f"http://127.0.0.1:{port}" for name, _, port in children if name.startswith("timesvc"))
        print(f"\nfor clients:  export CHRONOLOCK_STORE_URL={shlex.quote(store_url)}")
        print(f"              export CHRONOLOCK_TIMESVC_URLS={urls}")
        print(f"              export CHRONOLOCK_LEASEWATCH_URL=http://127.0.0.1:{base + 3}")
        print(f"then e.g.:    {shlex.quote(str(BIN / 'lockctl'))} run my-lock -- echo hello")
        lockctl = shlex.quote(str(BIN / "lockctl"))
        print(f"              {lockctl} list    (then: {lockctl} revoke NAME --token N)")
        if not own_admin_tokens:
            token_file = shlex.quote(str(STATE / "admin-token"))
            print(
                f'revocation over HTTP: curl -X POST -H "Authorization: Bearer $(cat {token_file})" '
                f"'http://127.0.0.1:{base + 3}/revoke/NAME?token=N'"
            )
        print(f"logs in {logs}; Ctrl-C stops everything")
        while all(proc.poll() is None for _, proc, _ in children):
            time.sleep(0.5)
        dead = [name for name, proc, _ in children if proc.poll() is not None]
        print(f"{', '.join(dead)} exited unexpectedly; stopping the rest", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    finally:
        stop()


if __name__ == "__main__":
    sys.exit(main())
