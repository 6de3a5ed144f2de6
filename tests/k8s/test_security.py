"""Issue 16 in the manifests: TLS to and between Cassandra nodes, least-privilege roles, and
NetworkPolicies that admit clients by namespace as well as by pod label."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lockclient.settings import StoreSettings, env_names
from tests.k8s.conftest import Rendered, containers, pod_labels, pod_template
from tests.k8s.test_manifests import _configmap_data, _job, _provided_env, _workload

# The stock encryption blocks of Cassandra 4.1's cassandra.yaml (abridged), for running the init
# container's script offline. The real 4.1.7 file is used by tests/security/test_cassandra_tls_real.py.
STOCK_YAML = """\
cluster_name: 'Test Cluster'
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
commitlog_sync: periodic
commitlog_sync_period: 10000ms
server_encryption_options:
  # comment inside the block
  internode_encryption: none
  legacy_ssl_storage_port_enabled: false
  keystore: conf/.keystore
  keystore_password: cassandra
  require_client_auth: false
  truststore: conf/.truststore
  truststore_password: cassandra
  require_endpoint_verification: false
client_encryption_options:
  enabled: false
  keystore: conf/.keystore
  keystore_password: cassandra
  require_client_auth: false
internode_compression: dc
transparent_data_encryption_options:
  enabled: false
"""


def cassandra_init_script(rendered: Rendered) -> tuple[str, dict[str, str]]:
    statefulset = _workload(rendered, "cassandra")
    init = next(c for c in pod_template(statefulset)["spec"]["initContainers"] if c["name"] == "config")
    env = {e["name"]: e["value"] for e in init.get("env", []) if "value" in e}
    return init["command"][2], env


def run_init_script(script: str, env: dict[str, str], tmp: Path, *, stock: str = STOCK_YAML) -> dict[str, Any]:
    """Run the init container's script with its paths moved under ``tmp``; return the cassandra.yaml."""
    etc, config, tls = tmp / "etc-cassandra", tmp / "config", tmp / "tls"
    for directory in (etc, config, tls):
        directory.mkdir(parents=True, exist_ok=True)
    (etc / "cassandra.yaml").write_text(stock)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tls / name).write_text(f"-----{name}-----\n")
    script = script.replace("/etc/cassandra/.", f"{etc}/.")
    script = re.sub(r"(?<![\w/])/config", str(config), script)
    script = re.sub(r"(?<![\w/])/tls/", f"{tls}/", script)
    result = subprocess.run(
        ["bash", "-ec", script],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = yaml.safe_load((config / "cassandra.yaml").read_text())
    return loaded


def test_prod_cassandra_requires_mutual_tls_from_clients_and_between_nodes(
    rendered_all: dict[str, Rendered], tmp_path: Path
) -> None:
    prod = rendered_all["prod"]
    script, env = cassandra_init_script(prod)
    assert env["CASSANDRA_TLS"] == "required"
    config = run_init_script(script, env, tmp_path)
    client, server = config["client_encryption_options"], config["server_encryption_options"]
    assert client["enabled"] is True and client["optional"] is False and client["require_client_auth"] is True
    assert server["internode_encryption"] == "all" and server["require_client_auth"] is True
    for options in (client, server):
        assert options["ssl_context_factory"]["class_name"].endswith("PEMBasedSslContextFactory")
        assert options["keystore"] == "/etc/cassandra/tls/keystore.pem"
        assert options["truststore"] == "/etc/cassandra/tls/ca.crt"
        assert "TLSv1" not in options["accepted_protocols"] and "TLSv1.1" not in options["accepted_protocols"]
    assert config["authenticator"] == "PasswordAuthenticator" and config["authorizer"] == "CassandraAuthorizer"
    assert (tmp_path / "config" / "tls" / "keystore.pem").read_text() == "-----tls.key-----\n-----tls.crt-----\n"
    volumes = {v["name"]: v for v in pod_template(_workload(prod, "cassandra"))["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "cassandra-tls"
    assert volumes["config"]["emptyDir"]["medium"] == "Memory", "the keystore holds the node's private key"


def test_the_init_script_fails_closed_without_certificates(rendered_all: dict[str, Rendered], tmp_path: Path) -> None:
    script, env = cassandra_init_script(rendered_all["prod"])
    script = script.replace("/tls/$f", "/nonexistent/$f")
    result = subprocess.run(
        ["bash", "-ec", script.replace("/etc/cassandra/.", f"{tmp_path}/.")],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode != 0


def test_clients_speak_verified_mutual_tls_in_prod(rendered_all: dict[str, Rendered]) -> None:
    prod = rendered_all["prod"]
    store = _configmap_data(prod, "chronolock-store")
    assert store["CHRONOLOCK_CASSANDRA_SSL"] == "true" and store["CHRONOLOCK_CASSANDRA_SSL_VERIFY"] == "full"
    assert store["CHRONOLOCK_CASSANDRA_SSL_HOSTNAME"]
    settings_tls = StoreSettings(
        store_url=store["CHRONOLOCK_STORE_URL"],
        cassandra_ssl=True,
        cassandra_ssl_ca=store["CHRONOLOCK_CASSANDRA_SSL_CA"],
        cassandra_ssl_cert=store["CHRONOLOCK_CASSANDRA_SSL_CERT"],
        cassandra_ssl_key=store["CHRONOLOCK_CASSANDRA_SSL_KEY"],
        cassandra_ssl_hostname=store["CHRONOLOCK_CASSANDRA_SSL_HOSTNAME"],
    ).tls()
    assert settings_tls.enabled and settings_tls.cert and settings_tls.key and settings_tls.hostname
    for name in ("timesvc", "leasewatch", _job(prod)["metadata"]["name"]):
        workload = _workload(prod, name)
        volumes = {v["name"]: v for v in pod_template(workload)["spec"]["volumes"]}
        container = containers(workload, init=False)[0]
        mounts = {
            m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"] if "secret" in volumes[m["name"]]
        }
        for path in (settings_tls.ca, settings_tls.cert, settings_tls.key):
            assert path is not None
            directory = str(Path(path).parent)
            assert directory in mounts, f"{name}: {path} is not on a Secret volume"
            assert mounts[directory]["secret"]["secretName"] == "chronolock-cassandra-client-tls"


def test_only_dev_turns_tls_off(rendered_all: dict[str, Rendered]) -> None:
    dev = rendered_all["dev"]
    assert _configmap_data(dev, "chronolock-store")["CHRONOLOCK_CASSANDRA_SSL"] == "false"
    assert cassandra_init_script(dev)[1]["CASSANDRA_TLS"] == "off"


@pytest.mark.parametrize("overlay", ["prod", "dev"])
@pytest.mark.parametrize("stock_line", ["", "paxos_variant: v1\n", "# paxos_variant: v1\n"])
def test_every_cassandra_node_runs_paxos_v2(
    rendered_all: dict[str, Rendered], tmp_path: Path, overlay: str, stock_line: str
) -> None:
    """Issue 27: the manifests run the Paxos variant docs/cassandra.md recommends, whether the
    image's cassandra.yaml leaves it out (4.1.7's does), sets it, or names it in a comment; and
    they do not purge Paxos state as "repaired", which needs paxos repairs nothing here schedules."""
    script, env = cassandra_init_script(rendered_all[overlay])
    config = run_init_script(script, env, tmp_path, stock=STOCK_YAML + stock_line)
    assert config["paxos_variant"] == "v2"
    assert "paxos_state_purging" not in config
    assert config["commitlog_sync"] == "batch"


def _secret_ref(container: dict[str, Any], variable: str) -> str | None:
    """The Secret a variable comes from, without the hash suffix generated Secrets carry."""
    for env in container.get("env", []):
        if env["name"] == variable and "secretKeyRef" in env.get("valueFrom", {}):
            return re.sub(r"-[a-z0-9]{10}$", "", str(env["valueFrom"]["secretKeyRef"]["name"]))
    return None


def test_least_privilege_roles(rendered: Rendered) -> None:
    """Services log in as the client role (SELECT/MODIFY only), the schema Job as the schema role,
    and no prod workload holds an administrator's login."""
    for service in ("timesvc", "leasewatch"):
        container = containers(_workload(rendered, service), init=False)[0]
        assert _secret_ref(container, "CHRONOLOCK_CASSANDRA_USERNAME") == "cassandra-credentials"
    job = _job(rendered)
    schema = containers(job)[0]
    assert _secret_ref(schema, "CHRONOLOCK_CASSANDRA_USERNAME") == "cassandra-schema-credentials"
    args = schema["args"]
    grant_to = args[args.index("--grant-to") + 1]
    admins = {
        w["metadata"]["name"]
        for w in rendered.workloads()
        for c in containers(w)
        if _secret_ref(c, "CHRONOLOCK_CASSANDRA_USERNAME") == "cassandra-admin"
    }
    if rendered.overlay == "prod":
        assert not admins
    else:
        assert admins == {"chronolock-roles-dev"}
        secrets = {s["metadata"]["name"].rsplit("-", 1)[0]: s for s in rendered.of_kind("Secret")}
        import base64

        client_user = base64.b64decode(secrets["cassandra-credentials"]["data"]["username"]).decode()
        assert grant_to == client_user, "the schema Job grants the role the services log in as"
        roles = containers(_workload(rendered, "chronolock-roles-dev"))[0]
        assert roles["args"][roles["args"].index("--client-role") + 1] == client_user
        assert set(_provided_env(rendered, roles)) == env_names(StoreSettings)


def test_client_ingress_requires_a_labelled_namespace(rendered: Rendered) -> None:
    """A pod label alone is self-assignable in any namespace; the namespace label is not."""
    seen = 0
    for policy in rendered.of_kind("NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if peer.get("podSelector", {}).get("matchLabels", {}).get("chronolock.io/client") == "true":
                    seen += 1
                    namespaces = peer.get("namespaceSelector")
                    assert namespaces and namespaces.get("matchLabels", {}).get("chronolock.io/clients") == "true", (
                        policy["metadata"]["name"]
                    )
                assert peer.get("namespaceSelector") != {} or "podSelector" not in peer, (
                    f"{policy['metadata']['name']}: a pod selector in every namespace"
                )
    assert seen == 3  # Cassandra, timesvc, leasewatch


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_store_users_carry_the_store_label(rendered_all: dict[str, Rendered], overlay: str) -> None:
    rendered = rendered_all[overlay]
    for workload in rendered.workloads():
        if any(_secret_ref(c, "CHRONOLOCK_CASSANDRA_USERNAME") for c in containers(workload)):
            assert pod_labels(workload).get("chronolock.io/store") == "true", workload["metadata"]["name"]
