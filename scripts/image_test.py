"""`make image-test`: build the project's container image with podman and prove it runs.

No Docker engine exists on the build machines and no registry image can be pulled, so:

1. a Debian bookworm base is made locally with ``mmdebstrap`` (minbase + Debian's CPython 3.11,
   ``python3-venv``, ``python-is-python3`` and ``passwd`` for ``useradd``) and imported;
2. the repository's own ``Dockerfile`` is built with ``podman build --build-arg
   PYTHON_BASE=<that base>`` (pip inside the build reaches PyPI through the host's trust store,
   mounted read-only for the build's RUN steps only: it is not in any layer);
3. the image is checked: its user is numeric 10001:10001, the three programs report their
   version, and with ``--read-only`` the root is mounted read-only (not even root may write
   there) while ``/tmp`` stays writable;
4. timesvc and leasewatch run from it in two containers — read-only, as that user, host network,
   listening on 127.0.0.1, sharing one SQLite store on a volume — and answer ``GET /now``,
   ``/healthz``, ``/readyz``, ``/status`` and leasewatch's page at ``/``;
5. ``lockctl run`` from the image takes a lock through them (global time from the timesvc
   container); the leasewatch container shows its holder and fencing token and reports the
   grant in ``/observed``; stopping the lockctl container (SIGTERM) releases it.

Podman gets a private ``containers.conf`` (``CONTAINERS_CONF``): runtime ``runc`` (crun
refuses this machine's hybrid cgroups) and no default ulimits (setting rlimits is not
permitted here) — the system's configuration is not touched — and a private image store
(``--root``/``--runroot`` in the run's temporary directory), so the run neither sees nor
removes anybody else's images, and its build-stage images cannot pile up in the system's
store. Everything it creates (containers, images, the store, the volume directory) is removed
at the end unless ``--keep`` is given. Every step is bounded (see ``timeout=`` below); the
docs/operations.md records a measured run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
LOCKCTL_HOLDS = ["lockctl", "run", "image-test", "--", "sleep", "120"]
ROOT = Path(__file__).resolve().parent.parent
USER = "10001:10001"
BASE_PACKAGES = "python3,python3-venv,python-is-python3,passwd"
HOST_TRUST_STORE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""


PODMAN: list[str] = ["podman"]
"""podman with the run's private storage (set in main())."""


class Failed(Exception):
    pass


def run(command: list[str], *, timeout: float, env: dict[str, str], check: bool = True) -> str:
    """Run ``command`` (``podman`` means the run's private podman, :data:`PODMAN`)."""
    shown = " ".join(command[:3])
    if command[0] == "podman":
        command = [*PODMAN, *command[1:]]
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"{' '.join(command[:4])} … did not finish in {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        raise Failed(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    print(f"  {time.monotonic() - started:6.1f} s  {shown} …", flush=True)
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)
    print(f"  ok       {what}", flush=True)


def wait_for(url: str, deadline_s: float) -> httpx.Response:
    deadline = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=2)
            if answer.status_code == 200:
                return answer
            last = f"{answer.status_code} {answer.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise Failed(f"{url} did not answer 200 within {deadline_s:.0f} s (last: {last})")


def wait_until(probe: Callable[[], T], what: str, deadline_s: float) -> T:
    """The first truthy answer of ``probe`` (HTTP errors count as not yet)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            answer = probe()
            if answer:
                return answer
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise Failed(f"no {what} within {deadline_s:.0f} s")
        time.sleep(0.2)


@contextmanager
def containers(env: dict[str, str]) -> Iterator[list[str]]:
    """Names of the containers started; each is removed at the end, by name."""
    started: list[str] = []
    try:
        yield started
    finally:
        for name in started:
            subprocess.run([*PODMAN, "logs", "--tail", "5", name], env=env, check=False, timeout=30)
            subprocess.run(
                [*PODMAN, "rm", "-f", "-t", "5", name], env=env, capture_output=True, check=False, timeout=60
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the images (and the base tarball) afterwards")
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the base (default bookworm)")
    args = parser.parse_args()

    for tool in ("podman", "mmdebstrap", "runc"):
        if shutil.which(tool) is None:
            print(
                f"image-test: {tool} is missing (`make image-test` installs podman, runc, mmdebstrap)", file=sys.stderr
            )
            return 2
    tag = f"{os.getpid()}"
    base_image = f"localhost/chronolock-base:{args.suite}-{tag}"
    image = f"localhost/chronolock:image-test-{tag}"
    work = Path(tempfile.mkdtemp(prefix="chronolock-image-"))
    conf = work / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    PODMAN[:] = ["podman", "--root", str(work / "storage"), "--runroot", str(work / "run")]
    started = time.monotonic()
    made_images: list[str] = []
    try:
        print(f"1. Debian {args.suite} base with mmdebstrap ({BASE_PACKAGES})", flush=True)
        tarball = work / "base.tar"
        run(
            ["mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", args.suite, str(tarball)],
            timeout=600,
            env=env,
        )
        run(["podman", "import", str(tarball), base_image], timeout=300, env=env)
        made_images.append(base_image)
        python = run(["podman", "run", "--rm", base_image, "python", "--version"], timeout=120, env=env).strip()
        check(python.startswith("Python 3.11."), f"the base's python is CPython 3.11 ({python})")

        print("2. podman build of the Dockerfile on that base", flush=True)
        build = ["podman", "build", "--network", "host", "--build-arg", f"PYTHON_BASE={base_image}", "-t", image]
        if HOST_TRUST_STORE.exists():
            # pip in the build reaches PyPI through the host's trust store; a build volume is
            # mounted for RUN steps only and never ends up in a layer.
            build += ["-v", f"{HOST_TRUST_STORE}:{HOST_TRUST_STORE}:ro"]
        run([*build, str(ROOT)], timeout=900, env=env)
        made_images.append(image)
        size = int(run(["podman", "image", "inspect", "--format", "{{.Size}}", image], timeout=60, env=env))
        base_size = int(run(["podman", "image", "inspect", "--format", "{{.Size}}", base_image], timeout=60, env=env))
        print(f"  image {size / 1e6:.0f} MB (its base {base_size / 1e6:.0f} MB)", flush=True)

        print("3. the image: numeric user, read-only root", flush=True)
        user = run(["podman", "image", "inspect", "--format", "{{.Config.User}}", image], timeout=60, env=env).strip()
        check(user == USER, f"image user is {USER} (got {user!r})")
        probe = run(
            ["podman", "run", "--rm", "--read-only", image, "sh", "-c", "id -u; id -g; touch /tmp/x && echo tmp-ok"],
            timeout=120,
            env=env,
        ).split()
        check(probe == ["10001", "10001", "tmp-ok"], f"runs as 10001:10001 by default, /tmp writable ({probe})")
        # As root, so that file modes cannot be what refuses the write: only the read-only mount.
        probe = run(
            [
                "podman", "run", "--rm", "--read-only", "--user", "0", image, "sh", "-c",
                "awk '$2 == \"/\" {split($4, o, \",\"); print o[1]}' /proc/mounts; "
                "touch /opt/chronolock/x 2>/dev/null && echo writable || echo refused",
            ],
            timeout=120,
            env=env,
        ).split()  # fmt: skip
        check(probe == ["ro", "refused"], f"with --read-only the root is mounted ro, even root cannot write ({probe})")
        for program in ("lockctl", "timesvc", "leasewatch"):
            out = run(["podman", "run", "--rm", "--read-only", image, program, "--version"], timeout=120, env=env)
            check(out.startswith(f"{program} "), f"{out.strip()} in the image")

        print("4. timesvc and leasewatch from the image on 127.0.0.1", flush=True)
        data = work / "data"
        data.mkdir()
        os.chown(data, 10001, 10001)
        ts_port, lw_port = free_port(), free_port()
        common = ["--network", "host", "--read-only", "--user", USER, "-v", f"{data}:/data"]
        common += ["-e", "CHRONOLOCK_STORE_URL=sqlite:////data/cells.db"]
        with containers(env) as names:
            for name, extra, command in (
                (
                    f"chronolock-timesvc-{tag}",
                    ["-e", "TIMESVC_HOST=127.0.0.1", "-e", f"TIMESVC_PORT={ts_port}", "-e", "TIMESVC_REPLICAS=1"],
                    "timesvc",
                ),
                (
                    f"chronolock-leasewatch-{tag}",
                    ["-e", "LEASEWATCH_HOST=127.0.0.1", "-e", f"LEASEWATCH_PORT={lw_port}"],
                    "leasewatch",
                ),
            ):
                run(
                    ["podman", "run", "-d", "--name", name, *common, *extra, image, command, "serve"],
                    timeout=120,
                    env=env,
                )
                names.append(name)
            ts, lw = f"http://127.0.0.1:{ts_port}", f"http://127.0.0.1:{lw_port}"
            now = wait_for(f"{ts}/now", 60).json()
            check(abs(now["now_us"] / 1e6 - time.time()) < 30, f"GET /now from the container: {now}")
            for url in (f"{ts}/healthz", f"{lw}/healthz", f"{ts}/readyz", f"{lw}/readyz"):
                wait_for(url, 60)
                check(True, f"{url} 200")
            for url in (f"{ts}/status", f"{lw}/status"):
                version = wait_for(url, 10).json()["version"]
                check(version != "0+unknown", f"{url} reports version {version}")
            page = wait_for(f"{lw}/", 10)
            check("leasewatch" in page.text and page.headers["content-type"].startswith("text/html"), "the page at /")
            listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True, check=False).stdout
            for port in (ts_port, lw_port):
                check(f"127.0.0.1:{port} " in listening, f"port {port} bound to 127.0.0.1 only")

            print("5. a lock taken by lockctl from the image, seen by leasewatch from the image", flush=True)
            holder = f"chronolock-lockctl-{tag}"
            clients = ["-e", f"CHRONOLOCK_TIMESVC_URLS={ts}", "-e", f"CHRONOLOCK_LEASEWATCH_URL={lw}"]
            run(
                ["podman", "run", "-d", "--name", holder, *common, *clients, image, *LOCKCTL_HOLDS],
                timeout=120,
                env=env,
            )
            names.append(holder)

            def holding() -> dict[str, Any]:
                body: dict[str, Any] = httpx.get(f"{lw}/locks/image-test", timeout=2).json()
                return body if body["holders"] else {}

            held = wait_until(holding, "holder of image-test", 60)
            check(
                held["holders"] and held["fencing_token"] >= 1,
                f"held: {held['holders']}, token {held['fencing_token']}",
            )
            seen = wait_until(lambda: httpx.get(f"{lw}/observed", timeout=2).json()["grants"], "grant observed", 30)
            check(seen[0]["lock_id"] == "image-test", f"leasewatch saw the grant (wait {seen[0]['wait_s']} s)")
            run(["podman", "stop", "-t", "10", holder], timeout=60, env=env)  # SIGTERM: lockctl releases
            wait_until(lambda: not httpx.get(f"{lw}/locks/image-test", timeout=2).json()["holders"], "release", 30)
            check(True, "lockctl released the lock when its container stopped")
    except Failed as exc:
        print(f"image-test FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            # Only the private store is emptied: its images and containers, then the directory.
            for what in (["rm", "-a", "-f"], ["rmi", "-a", "-f"]):
                subprocess.run([*PODMAN, *what], env=env, capture_output=True, check=False, timeout=120)
            # A mount left inside it (an interrupted build) would keep rmtree from emptying it.
            with open("/proc/self/mounts", encoding="utf-8") as mounts:
                ours = [f.split()[1] for f in mounts if f.split()[1].startswith(f"{work}/")]
            for mount in sorted(ours, reverse=True):
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False, timeout=60)
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept: {', '.join(made_images)} in the store {work / 'storage'} (podman --root)")
    print(f"image-test passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
