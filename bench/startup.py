"""startup: what ``import lockclient`` and ``lockctl run NAME -- true`` cost (issue 25, item 3).

Measured as an application gets them: the wheel is built from the source tree and installed into
fresh virtualenvs — the base install (``pip install chronolock``) for the import, ``[cli]`` for
lockctl — so neither the development install's editable finder nor the dev tools are on the path.
Each round runs, in turn, ``python -c pass`` (the interpreter alone), ``python -c "import
lockclient"``, ``lockctl run bench -- true`` on a fresh embedded store, ``import pydantic_settings`` and
``import typer`` alone (lockctl's two largest dependencies: where its time goes) and, for
reference, ``flock FILE true``; the figures are medians (and p90) over the rounds, as wall time of the whole
process. The store's own share of ``lockctl run`` — opening it, global time, one acquisition and
its release — is measured in this process (``RemoteLocker.from_env()`` … ``close()``), so that
the target reads: lockctl ≤ python + 150 ms + the store's work.

``--against REF`` builds a second wheel from a git ref (``git archive``) and runs its rows in the
same rounds: before and after, side by side on the same busy machine.

Each process's CPU time (user + system, its children included: ``os.wait4``) is reported next to
its wall time. On a shared 2-core machine the wall time of a short process is mostly waiting for
a core (the 1-minute load is sampled every round and reported); CPU time is what the process
itself costs, so the targets are judged on both.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, markdown_table, percentile, write_results

__all__ = ["run"]

ROOT = Path(__file__).resolve().parent.parent
TARGET_IMPORT_MS = 150.0
TARGET_LOCKCTL_OVER_PYTHON_MS = 150.0


def _check(command: list[str], **kwargs: Any) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env = {k: v for k, v in env.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _wheel(source: Path, out: Path) -> Path:
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)]
    _check(command, env=_clean_env())
    (wheel,) = out.glob("chronolock-*.whl")
    return wheel


def _venv(where: Path, requirement: str) -> Path:
    env = _clean_env()
    _check([sys.executable, "-m", "venv", str(where)], env=env)
    _check([str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement], env=env)
    return where / "bin"


def _time(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and the children it waited for)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {stderr.decode()[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def _store_work_ms(store_url: str, rounds: int) -> tuple[list[float], list[float]]:
    """Open the store, take and release one lock, close — what lockctl run does besides starting.
    (wall ms, CPU ms of this process) per round."""
    os.environ["CHRONOLOCK_STORE_URL"] = store_url
    try:
        from lockclient import RemoteLocker

        samples = []
        cpu = []
        for _ in range(rounds):
            started = time.perf_counter()
            started_cpu = time.process_time()
            locker = RemoteLocker.from_env()
            locker.get_lock("bench-store").release()
            locker.close()
            samples.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - started_cpu) * 1000)
        return samples, cpu
    finally:
        del os.environ["CHRONOLOCK_STORE_URL"]


def run(*, quick: bool = False, against: str | None = None) -> None:
    rounds = 8 if quick else 25
    print(f"[bench startup] {rounds} rounds; building wheels and virtualenvs", flush=True)
    info = machine_info()
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-startup-") as tmp_name:
        tmp = Path(tmp_name)
        builds = {"this tree": ROOT}
        if against:
            ref_tree = tmp / "ref-source"
            ref_tree.mkdir()
            archive = tmp / "ref.tar"
            with archive.open("wb") as out:
                subprocess.run(["git", "-C", str(ROOT), "archive", against], stdout=out, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(ref_tree, filter="data")
            builds[against] = ref_tree
        bins: dict[str, tuple[Path, Path]] = {}
        for label, source in builds.items():
            key = label.replace(" ", "-").replace("/", "-")
            wheel = _wheel(source, tmp / f"wheel-{key}")
            bins[label] = (_venv(tmp / f"base-{key}", str(wheel)), _venv(tmp / f"cli-{key}", f"{wheel}[cli]"))
        work = tmp / "work"
        work.mkdir()
        env = _clean_env() | {"CHRONOLOCK_STORE_URL": f"sqlite:///{work / 'cells.db'}"}
        flock = shutil.which("flock")
        samples: dict[str, list[float]] = {}
        cpu_samples: dict[str, list[float]] = {}
        loads = [os.getloadavg()[0]]

        def sample(name: str, command: list[str]) -> None:
            wall, cpu = _time(command, env, work)
            samples.setdefault(name, []).append(wall * 1000)
            cpu_samples.setdefault(name, []).append(cpu * 1000)

        for _base, cli in bins.values():  # warm the page cache and create the store
            _time([str(cli / "lockctl"), "run", "bench", "--", "true"], env, work)
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for label, (base, cli) in bins.items():
                sample(f"python -c pass ({label})", [str(base / "python"), "-c", "pass"])
                sample(f"import lockclient ({label})", [str(base / "python"), "-c", "import lockclient"])
                sample(f"lockctl run -- true ({label})", [str(cli / "lockctl"), "run", "bench", "--", "true"])
            # Where lockctl's time goes (this tree's [cli] venv): its two largest dependencies alone.
            cli = bins["this tree"][1]
            for module in ("pydantic_settings", "typer"):
                sample(f"import {module} (this tree's [cli] venv)", [str(cli / "python"), "-c", f"import {module}"])
            if flock:
                sample("flock FILE true", [flock, str(work / "flock"), "true"])
        store_ms, store_cpu_ms = _store_work_ms(env["CHRONOLOCK_STORE_URL"], rounds)
        loads.append(os.getloadavg()[0])
        count = "import sys, lockclient; print(len(sys.modules))"
        modules = {
            label: int(_check([str(base / "python"), "-c", count], env=env, cwd=work))
            for label, (base, _cli) in bins.items()
        }

    def med(name: str) -> float:
        return statistics.median(samples[name])

    def med_cpu(name: str) -> float:
        return statistics.median(cpu_samples[name])

    rows = [
        [
            name,
            round(med(name), 1),
            round(percentile(values, 90), 1),
            round(min(values), 1),
            round(med_cpu(name), 1),
            round(min(cpu_samples[name]), 1),
        ]
        for name, values in samples.items()
    ]
    rows.append(
        [
            "store work of lockctl run (in-process)",
            round(statistics.median(store_ms), 1),
            round(percentile(store_ms, 90), 1),
            round(min(store_ms), 1),
            round(statistics.median(store_cpu_ms), 1),
            round(min(store_cpu_ms), 1),
        ]
    )
    verdicts = []
    for label in bins:
        python = med(f"python -c pass ({label})")
        imported = med(f"import lockclient ({label})") - python
        lockctl = med(f"lockctl run -- true ({label})") - python
        budget = TARGET_LOCKCTL_OVER_PYTHON_MS + statistics.median(store_ms)
        python_cpu = med_cpu(f"python -c pass ({label})")
        lockctl_cpu = med_cpu(f"lockctl run -- true ({label})") - python_cpu
        budget_cpu = TARGET_LOCKCTL_OVER_PYTHON_MS + statistics.median(store_cpu_ms)
        verdicts.append(
            [
                label,
                modules[label],
                round(imported, 1),
                "met" if imported <= TARGET_IMPORT_MS else "missed",
                round(lockctl, 1),
                round(budget, 1),
                "met" if lockctl <= budget else "missed",
                round(lockctl_cpu, 1),
                round(budget_cpu, 1),
                "met" if lockctl_cpu <= budget_cpu else "missed",
            ]
        )
    data = {
        "machine": info,
        "rounds": rounds,
        "samples_ms": samples,
        "cpu_ms": cpu_samples,
        "store_work_ms": store_ms,
        "store_work_cpu_ms": store_cpu_ms,
        "loadavg_1m": [round(load, 2) for load in loads],
        "modules_after_import": modules,
    }
    markdown = "\n\n".join(
        [
            "# startup: import lockclient and lockctl run -- true",
            f"Machine: {info['cpus']} CPUs, Python {info['python']}, load {info['loadavg_1m_at_start']} at the start "
            f"({info['when_utc']}); 1-minute load {min(loads):.1f}–{max(loads):.1f} during the run (median "
            f"{statistics.median(loads):.1f}, sampled every round). {rounds} rounds; wall time and CPU time (user + "
            "system, children included) of each process, ms; wheels installed into fresh virtualenvs (base install "
            "for the import, [cli] for lockctl), an embedded store.",
            markdown_table(["command", "median ms", "p90 ms", "min ms", "CPU median ms", "CPU min ms"], rows),
            markdown_table(
                [
                    "build",
                    "modules after import",
                    "import lockclient − python (ms)",
                    f"≤ {TARGET_IMPORT_MS:g} ms",
                    "lockctl run − python (ms)",
                    "budget: 150 ms + store work (ms)",
                    "within",
                    "CPU: lockctl run − python (ms)",
                    "CPU budget: 150 ms + store work's CPU (ms)",
                    "within",
                ],
                verdicts,
            ),
        ]
    )
    write_results("startup", data, markdown)
