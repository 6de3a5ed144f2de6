"""Issue 16, finding 5: secrets never leave through settings output, errors, tracebacks, logs, or
``lockctl run``'s child — one redaction function (lockclient.redact) used everywhere."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leasewatch.settings import LeasewatchSettings
from lockclient.settings import SERVICE_SECRET_ENV, StoreSettings, secret_env_names
from timesvc.settings import TimesvcSettings

BIN = Path(sys.executable).parent
URL_PASSWORD = "Url-Passw0rd-in-the-store-url"
ENV_PASSWORD = "Env-Passw0rd-from-the-secret"
ADMIN = "admin-token-0123456789abcdef0123456789"
READ = "read-token-0123456789abcdef01234567890"


@pytest.fixture(autouse=True)
def _fresh_secret_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets registered by earlier tests in this process (a real Cassandra's login
    "cassandra", say) must not change what these tests see."""
    from lockclient import redact

    monkeypatch.setattr(redact, "_registry", redact._Registry())


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env.update(extra)
    return env


SECRET_ENV = {
    "CHRONOLOCK_STORE_URL": f"cassandra://app:{URL_PASSWORD}@db1,db2:9042/chronolock?dc=dc1",
    "CHRONOLOCK_CASSANDRA_PASSWORD": ENV_PASSWORD,
    "LEASEWATCH_ADMIN_TOKENS": f"alice:{ADMIN}",
    "LEASEWATCH_READ_TOKEN": READ,
    "TIMESVC_READ_TOKEN": READ,
}


@pytest.mark.parametrize("program", ["timesvc", "leasewatch", "lockctl"])
def test_settings_commands_hide_every_secret(program: str) -> None:
    for as_json in ([], ["--json"]):
        result = subprocess.run(
            [str(BIN / program), "settings", *as_json],
            env=_env(**SECRET_ENV),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        for secret in (URL_PASSWORD, ENV_PASSWORD, ADMIN, READ):
            assert secret not in result.stdout + result.stderr
        assert "cassandra://db1,db2:9042/chronolock?dc=dc1" in result.stdout
    shown = json.loads(result.stdout)
    assert shown["CHRONOLOCK_STORE_URL"] == "cassandra://db1,db2:9042/chronolock?dc=dc1"
    assert shown["CHRONOLOCK_CASSANDRA_PASSWORD"] == "***"
    if program != "lockctl":
        assert shown[f"{program.upper()}_READ_TOKEN"] == "***"


def test_a_rejected_secret_setting_is_not_echoed(tmp_path: Path) -> None:
    short = "short-token-value"
    result = subprocess.run(
        [str(BIN / "leasewatch"), "settings"],
        env=_env(LEASEWATCH_ADMIN_TOKENS=f"bob:{short}", CHRONOLOCK_STORE_URL=f"sqlite:///{tmp_path}/cells.db"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78
    assert "LEASEWATCH_ADMIN_TOKENS" in result.stderr and "32 characters" in result.stderr
    assert short not in result.stderr


def test_log_lines_and_tracebacks_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    """Both renderers, structlog events and foreign loggers (the driver, uvicorn) alike."""
    from lockclient.logs import configure_logging, get_logger
    from lockclient.redact import register_secret

    register_secret(ENV_PASSWORD)
    for fmt in ("json", "console"):
        configure_logging("info", fmt)
        get_logger("lockclient.test").warning(
            "event", detail=f"password is {ENV_PASSWORD}", nested={"k": [ENV_PASSWORD]}
        )
        try:
            raise RuntimeError(f"cannot reach cassandra://app:{URL_PASSWORD}@db:9042/ks ({ENV_PASSWORD})")
        except RuntimeError:
            logging.getLogger("cassandra.cluster").exception("control connection failed")
            get_logger("lockclient.test").exception("failed")
        logging.getLogger("uvicorn.error").error("Authorization: Bearer %s", ADMIN)
        err = capsys.readouterr().err
        assert "control connection failed" in err and "RuntimeError" in err  # the traceback is there
        for secret in (ENV_PASSWORD, URL_PASSWORD, ADMIN):
            assert secret not in err, (fmt, err)
    logging.getLogger().handlers.clear()


def test_entry_points_redact_an_unexpected_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from lockclient.entrypoint import guarded_main

    def boom() -> None:
        raise RuntimeError(f"driver said: cassandra://app:{URL_PASSWORD}@db/ks")

    with pytest.raises(SystemExit) as exited:
        guarded_main(boom, program="x")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError" in err and URL_PASSWORD not in err


def test_service_secret_list_matches_the_service_settings() -> None:
    """lockctl (the library) may not import the services; its list of their secrets must not drift."""
    services = secret_env_names(TimesvcSettings) | secret_env_names(LeasewatchSettings)
    assert services - secret_env_names(StoreSettings) == SERVICE_SECRET_ENV


def test_lockctl_run_does_not_hand_its_secrets_to_the_command(tmp_path: Path) -> None:
    env = _env(
        CHRONOLOCK_STORE_URL=f"sqlite:///{tmp_path}/cells.db",
        CHRONOLOCK_CASSANDRA_PASSWORD=ENV_PASSWORD,
        LEASEWATCH_ADMIN_TOKENS=f"alice:{ADMIN}",
        LEASEWATCH_ADMIN_TOKEN=ADMIN,
        TIMESVC_READ_TOKEN=READ,
        UNRELATED="kept",
    )
    dump = tmp_path / "env.json"
    command = [sys.executable, "-c", f"import json, os; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"]
    result = subprocess.run(
        [str(BIN / "lockctl"), "run", "job", "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(dump.read_text())
    assert seen["UNRELATED"] == "kept" and seen["CHRONOLOCK_LOCK_ID"] == "job"
    for name in (
        "CHRONOLOCK_CASSANDRA_PASSWORD",
        "LEASEWATCH_ADMIN_TOKENS",
        "LEASEWATCH_ADMIN_TOKEN",
        "TIMESVC_READ_TOKEN",
    ):
        assert name not in seen
    assert ENV_PASSWORD not in dump.read_text() and ADMIN not in dump.read_text()
    # Asked for explicitly: passed on.
    result = subprocess.run(
        [str(BIN / "lockctl"), "run", "job", "--pass-secrets", "--", *command],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(dump.read_text())["CHRONOLOCK_CASSANDRA_PASSWORD"] == ENV_PASSWORD


def test_the_store_url_handed_to_the_command_carries_no_credentials() -> None:
    from lockclient.cli import child_environment

    env = child_environment({"CHRONOLOCK_STORE_URL": f"cassandra://app:{URL_PASSWORD}@db:9042/ks?dc=dc1"})
    assert env["CHRONOLOCK_STORE_URL"] == "cassandra://db:9042/ks?dc=dc1"


def test_redact_by_shape_and_by_value() -> None:
    from lockclient.redact import redact, register_secret

    register_secret("a-registered-secret-value")
    text = (
        "cassandra://u:p@ss:w0rd@h1,h2:9042/ks http://x:y@host/ Authorization: Bearer abc.def "
        "password=hunter2&x=1 token: t0k3n value a-registered-secret-value"
    )
    out = redact(text)
    for secret in ("p@ss:w0rd", ":y@", "abc.def", "hunter2", "t0k3n", "a-registered-secret-value"):
        assert secret not in out, out
    assert "cassandra://u:***@h1,h2:9042/ks" in out and "x=1" in out
    assert io.StringIO(redact("")).read() == ""


def test_a_registered_secret_inside_a_url_scheme_does_not_unmask_the_url_password() -> None:
    """Found on the ring: the real node's login is cassandra/cassandra; once "cassandra" was
    registered, masking it first turned "cassandra://app:pw@h" into "***://app:pw@h", which
    the URL pattern no longer matched — the URL's password was left in the clear."""
    from lockclient.redact import redact, register_secret

    register_secret("cassandra")
    out = redact(f"cannot reach cassandra://app:{URL_PASSWORD}@db:9042/ks")
    assert URL_PASSWORD not in out, out
    assert "cassandra" not in out, out
