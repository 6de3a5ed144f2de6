"""Checks on the rendered objects that schema validation and linters cannot see."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from tests.k8s.conftest import (
    EXTERNAL_SECRETS,
    K8S,
    NAMESPACE,
    Rendered,
    containers,
    pod_labels,
    pod_template,
    selector_matches,
)

# ---- helpers ------------------------------------------------------------------------------------


def _ports(container: dict[str, Any]) -> dict[str | int, int]:
    """Container ports by name and by number -> number."""
    found: dict[str | int, int] = {}
    for port in container.get("ports", []):
        found[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            found[port["name"]] = port["containerPort"]
    return found


def _pod_ports(workload: dict[str, Any]) -> dict[str | int, int]:
    found: dict[str | int, int] = {}
    for container in containers(workload, init=False):
        found.update(_ports(container))
    return found


def _selected(rendered: Rendered, selector: dict[str, Any], *, plain: bool = False) -> list[dict[str, Any]]:
    """Workloads whose pods a selector matches (plain=True: a Service's map selector)."""
    sel = {"matchLabels": selector} if plain else selector
    return [w for w in rendered.workloads() if selector_matches(sel, pod_labels(w))]


def _workload(rendered: Rendered, name: str) -> dict[str, Any]:
    found = [w for w in rendered.workloads() if w["metadata"]["name"] == name]
    assert len(found) == 1, f"{rendered.overlay}: workload {name} not found exactly once"
    return found[0]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in containers(workload) if c["name"] == name]
    assert len(found) == 1, f"container {name} not in {workload['metadata']['name']}"
    return found[0]


def _env_value(container: dict[str, Any], name: str) -> str:
    values = [e["value"] for e in container.get("env", []) if e["name"] == name and "value" in e]
    assert len(values) == 1, f"{container['name']}: env {name} not set exactly once with a value"
    return str(values[0])


def _real_name(rendered: Rendered, kind: str, name: str) -> str | None:
    """The rendered name for `name`: generated objects carry a hash suffix (references are rewritten to it)."""
    names = [doc["metadata"]["name"] for doc in rendered.of_kind(kind)]
    if name in names:
        return name
    hashed = [n for n in names if re.fullmatch(rf"{re.escape(name)}-[a-z0-9]{{10}}", n)]
    assert len(hashed) <= 1, f"{rendered.overlay}: several {kind}s named like {name}: {hashed}"
    return hashed[0] if hashed else None


def _configmap_data(rendered: Rendered, name: str) -> dict[str, str]:
    real = _real_name(rendered, "ConfigMap", name)
    assert real, f"{rendered.overlay}: ConfigMap {name} referenced but not rendered"
    return dict(rendered.one("ConfigMap", real).get("data", {}))


def _secret_keys(rendered: Rendered, name: str) -> frozenset[str]:
    """Keys of a rendered Secret, or of one the overlay documents as created outside Kustomize."""
    real = _real_name(rendered, "Secret", name)
    if real:
        secret = rendered.one("Secret", real)
        return frozenset({**secret.get("data", {}), **secret.get("stringData", {})})
    external = EXTERNAL_SECRETS[rendered.overlay]
    assert name in external, (
        f"{rendered.overlay}: Secret {name} is neither rendered nor listed as an external Secret "
        "(tests/k8s/conftest.py EXTERNAL_SECRETS, documented in k8s/README.md)"
    )
    return external[name]


def _provided_env(rendered: Rendered, container: dict[str, Any]) -> dict[str, str | None]:
    """Every env var name the container receives -> literal value (None: from a Secret or fieldRef)."""
    provided: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = _configmap_data(rendered, source["configMapRef"]["name"])
            for key, value in data.items():
                assert key not in provided, f"{container['name']}: {key} provided twice"
                provided[key] = value
        if "secretRef" in source:
            for key in _secret_keys(rendered, source["secretRef"]["name"]):
                assert key not in provided, f"{container['name']}: {key} provided twice"
                provided[key] = None
    for env in container.get("env", []):
        assert env["name"] not in provided, f"{container['name']}: {env['name']} provided twice (env overrides envFrom)"
        provided[env["name"]] = env.get("value")
    return provided


def _quantity(value: str | int) -> float:
    """Kubernetes/JVM quantities in bytes or cores: 512M, 2G, 4Gi, 1536Mi, 250m, 2."""
    text = str(value)
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "K": 2**10,
        "M": 2**20,
        "G": 2**30,
        "k": 1e3,
        "m": 1e-3,
    }
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def _namespaced(doc: dict[str, Any]) -> bool:
    return doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass"}


# ---- structure: selectors, ports, references -------------------------------------------------------


def test_everything_lives_in_the_restricted_namespace(rendered: Rendered) -> None:
    namespace = rendered.one("Namespace", NAMESPACE)
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels.get(f"pod-security.kubernetes.io/{mode}") == "restricted"
    for doc in rendered.docs:
        if _namespaced(doc):
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']}"


def test_workload_selectors_match_their_pods(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        if workload["kind"] == "Job":
            continue  # the Job controller generates its selector
        selector = workload["spec"]["selector"]
        assert selector_matches(selector, pod_labels(workload)), workload["metadata"]["name"]
        # No other workload's pods may fall under this selector (a Service would mix them).
        others = [w for w in _selected(rendered, selector) if w is not workload]
        assert not others, f"{workload['metadata']['name']} selector also matches {others}"


def test_services_select_pods_and_target_existing_ports(rendered: Rendered) -> None:
    for service in rendered.of_kind("Service"):
        name = service["metadata"]["name"]
        selected = _selected(rendered, service["spec"]["selector"], plain=True)
        assert selected, f"{rendered.overlay}: Service {name} selects no workload"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for workload in selected:
                assert target in _pod_ports(workload), f"Service {name} targets {target!r}, not a port of its pods"


def test_pdbs_select_workloads(rendered: Rendered) -> None:
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        selected = _selected(rendered, pdb["spec"]["selector"])
        assert selected, f"{rendered.overlay}: PDB {pdb['metadata']['name']} selects no workload"
        assert "maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"]
    covered = {
        w["metadata"]["name"]
        for pdb in rendered.of_kind("PodDisruptionBudget")
        for w in _selected(rendered, pdb["spec"]["selector"])
    }
    assert {"cassandra", "timesvc", "leasewatch"} <= covered


def _peer_selectors(rule_peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pod selectors of in-namespace peers (no namespaceSelector, no ipBlock)."""
    return [peer["podSelector"] for peer in rule_peers if "podSelector" in peer and "namespaceSelector" not in peer]


def test_network_policies_select_workloads_and_real_ports(rendered: Rendered) -> None:
    for policy in rendered.of_kind("NetworkPolicy"):
        name = policy["metadata"]["name"]
        spec = policy["spec"]
        selected = _selected(rendered, spec["podSelector"])
        assert selected, f"{rendered.overlay}: NetworkPolicy {name} selects no workload"
        for rule in spec.get("ingress", []):
            for selector in _peer_selectors(rule.get("from", [])):
                assert _selected(rendered, selector), f"NetworkPolicy {name}: ingress peer {selector} matches no pod"
            for port in rule.get("ports", []):
                assert any(port["port"] in _pod_ports(w) for w in selected), f"NetworkPolicy {name}: port {port}"
        for rule in spec.get("egress", []):
            for selector in _peer_selectors(rule.get("to", [])):
                targets = _selected(rendered, selector)
                assert targets, f"NetworkPolicy {name}: egress peer {selector} matches no pod"
                for port in rule.get("ports", []):
                    assert any(port["port"] in _pod_ports(t) for t in targets), f"NetworkPolicy {name}: port {port}"


def _allows_ingress(rendered: Rendered, target: str, source_labels: dict[str, str], port: int) -> bool:
    for policy in rendered.of_kind("NetworkPolicy"):
        spec = policy["spec"]
        if "Ingress" not in spec.get("policyTypes", []):
            continue
        if _workload(rendered, target) not in _selected(rendered, spec["podSelector"]):
            continue
        for rule in spec.get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if port not in ports:
                continue
            for peer in rule.get("from", []):
                if "podSelector" in peer and selector_matches(peer["podSelector"], source_labels):
                    return True
    return False


def _allows_egress(rendered: Rendered, source: str, target_labels: dict[str, str], port: int) -> bool:
    for policy in rendered.of_kind("NetworkPolicy"):
        spec = policy["spec"]
        if "Egress" not in spec.get("policyTypes", []):
            continue
        if _workload(rendered, source) not in _selected(rendered, spec["podSelector"]):
            continue
        for rule in spec.get("egress", []):
            if port not in [p["port"] for p in rule.get("ports", [])]:
                continue
            for peer in rule.get("to", []):
                if "podSelector" in peer and selector_matches(peer["podSelector"], target_labels):
                    return True
    return False


def test_network_policy_flows(rendered: Rendered) -> None:
    """Default deny, DNS for everyone, and exactly the flows chronolock needs."""
    deny = rendered.one("NetworkPolicy", "default-deny")["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    dns = rendered.one("NetworkPolicy", "allow-dns-egress")["spec"]
    assert dns["podSelector"] == {}
    assert {(p["protocol"], p["port"]) for r in dns["egress"] for p in r["ports"]} == {("UDP", 53), ("TCP", 53)}

    cassandra = pod_labels(_workload(rendered, "cassandra"))
    for peer_port in (7000, 7001):
        assert _allows_ingress(rendered, "cassandra", cassandra, peer_port)
        assert _allows_egress(rendered, "cassandra", cassandra, peer_port)
    for store_user in ("timesvc", "leasewatch", _job(rendered)["metadata"]["name"]):
        labels = pod_labels(_workload(rendered, store_user))
        assert _allows_egress(rendered, store_user, cassandra, 9042), store_user
        assert _allows_ingress(rendered, "cassandra", labels, 9042), store_user
    client = {"chronolock.io/client": "true"}
    assert _allows_ingress(rendered, "cassandra", client, 9042)
    assert _allows_ingress(rendered, "timesvc", client, 8700)
    assert _allows_ingress(rendered, "leasewatch", client, 8710)
    # timesvc and leasewatch do not talk to each other, and nothing but clients reaches them.
    assert not _allows_ingress(rendered, "timesvc", pod_labels(_workload(rendered, "leasewatch")), 8700)


def test_probe_ports_exist(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        for container in containers(workload):
            ports = _ports(container)
            for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.get(probe_name)
                if not probe:
                    continue
                assert "exec" not in probe, f"{container['name']} {probe_name}: no exec probes (one process per probe)"
                handler = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc")
                assert handler, f"{container['name']} {probe_name} has no handler"
                assert handler["port"] in ports, f"{container['name']} {probe_name} port {handler['port']!r}"


def test_configmap_and_secret_references_exist(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        for container in containers(workload):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert _configmap_data(rendered, source["configMapRef"]["name"])
                    assert not source["configMapRef"].get("optional")
                if "secretRef" in source:
                    assert _secret_keys(rendered, source["secretRef"]["name"])
            for env in container.get("env", []):
                ref = env.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    key = ref["configMapKeyRef"]
                    assert key["key"] in _configmap_data(rendered, key["name"]), f"{container['name']}: {env['name']}"
                if "secretKeyRef" in ref:
                    key = ref["secretKeyRef"]
                    assert key["key"] in _secret_keys(rendered, key["name"]), f"{container['name']}: {env['name']}"
                    assert not key.get("optional"), f"{env['name']}: a missing Secret must stop the pod"


def test_secret_volumes_reference_known_secrets_and_keys(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        for volume in pod_template(workload)["spec"].get("volumes", []):
            secret = volume.get("secret")
            if secret is None:
                continue
            keys = _secret_keys(rendered, secret["secretName"])
            for item in secret.get("items", []):
                assert item["key"] in keys, f"{workload['metadata']['name']}: {secret['secretName']}/{item['key']}"
            if secret.get("optional"):
                # Only the TLS material may be optional (dev turns TLS off); credentials never.
                assert secret["secretName"] in ("cassandra-tls", "chronolock-cassandra-client-tls"), secret


def test_external_secrets_are_documented() -> None:
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    for secrets in EXTERNAL_SECRETS.values():
        for name, keys in secrets.items():
            assert name in readme, f"k8s/README.md does not tell operators to create Secret {name}"
            for key in keys:
                assert key in readme


# ---- every container: resources, probes, restricted security context -----------------------------


def test_every_container_has_resources(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        for container in containers(workload):
            resources = container.get("resources", {})
            where = f"{rendered.overlay} {workload['metadata']['name']}/{container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{where}: cpu+memory requests"
            assert "memory" in resources.get("limits", {}), f"{where}: memory limit"
            for kind in ("cpu", "memory"):
                if kind in resources.get("limits", {}):
                    assert _quantity(resources["limits"][kind]) >= _quantity(resources["requests"][kind]), where


def test_long_running_containers_have_probes(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        if workload["kind"] in ("Job", "CronJob"):
            continue
        for container in containers(workload, init=False):
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert probe in container, f"{workload['metadata']['name']}/{container['name']}: no {probe}"


def test_restricted_security_context(rendered: Rendered) -> None:
    """Pod Security Standard 'restricted' plus a read-only root filesystem, for every container."""
    for workload in rendered.workloads():
        spec = pod_template(workload)["spec"]
        pod_ctx = spec.get("securityContext", {})
        name = workload["metadata"]["name"]
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host), f"{name}: {host}"
        assert spec.get("automountServiceAccountToken") is False, f"{name}: mounts a service account token"
        assert spec.get("serviceAccountName") not in (None, "default"), f"{name}: dedicated ServiceAccount"
        assert all("hostPath" not in volume for volume in spec.get("volumes", [])), name
        for container in containers(workload):
            ctx = {**pod_ctx, **container.get("securityContext", {})}
            where = f"{rendered.overlay} {name}/{container['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert isinstance(ctx.get("runAsUser"), int) and ctx["runAsUser"] > 0, f"{where}: numeric non-root uid"
            assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where
            assert not container.get("securityContext", {}).get("privileged"), where
            capabilities = container.get("securityContext", {}).get("capabilities", {})
            assert capabilities.get("drop") == ["ALL"] and not capabilities.get("add"), where
            assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert container.get("securityContext", {}).get("readOnlyRootFilesystem") is True, where
            if container in containers(workload, init=False):
                mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
                assert "/tmp" in mounts, f"{where}: read-only root needs a writable /tmp"


def test_images_are_pinned(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        for container in containers(workload):
            image = container["image"]
            where = f"{rendered.overlay} {workload['metadata']['name']}/{container['name']}: {image}"
            if "@sha256:" in image:
                continue
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag, f"{where}: no explicit tag"
            assert tag != "latest" and re.fullmatch(r"\d+\.\d+\.\d+([-.][\w.]+)?", tag), f"{where}: not a version tag"
            assert "google-samples" not in image, f"{where}: not the old tutorial image"
    cassandra = _container(_workload(rendered, "cassandra"), "cassandra")
    assert re.fullmatch(r"cassandra:(4\.1|5\.0)\.\d+", cassandra["image"]), cassandra["image"]


# ---- timesvc / leasewatch -------------------------------------------------------------------------

SERVICES = {"timesvc": ("TIMESVC", 8700), "leasewatch": ("LEASEWATCH", 8710)}


def _settings_class(service: str) -> type[Any]:
    module = importlib.import_module(f"{service}.settings")
    return getattr(module, f"{service.capitalize()}Settings")  # type: ignore[no-any-return]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_config_drift_service_env_is_exactly_the_settings(rendered: Rendered, service: str) -> None:
    """The Deployment provides exactly the variables the settings class reads, no more, no fewer."""
    from lockclient.settings import env_names

    container = _container(_workload(rendered, service), service)
    provided = set(_provided_env(rendered, container))
    expected = env_names(_settings_class(service))
    assert provided == expected, f"missing {sorted(expected - provided)}, unknown {sorted(provided - expected)}"
    prefix, _ = SERVICES[service]
    replica = next(e for e in container["env"] if e["name"] == f"{prefix}_REPLICA_ID")
    assert replica["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_config_drift_schema_job_env_is_the_store_settings(rendered: Rendered) -> None:
    from lockclient.settings import StoreSettings, env_names

    job = _job(rendered)
    provided = set(_provided_env(rendered, containers(job)[0]))
    assert provided == env_names(StoreSettings)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_settings_parse_and_match_the_manifest(
    rendered: Rendered, service: str, clean_env: pytest.MonkeyPatch
) -> None:
    """The ConfigMap values are valid settings; host/port/grace agree with the pod spec."""
    workload = _workload(rendered, service)
    container = _container(workload, service)
    prefix, default_port = SERVICES[service]
    for name, value in _provided_env(rendered, container).items():
        clean_env.setenv(name, value if value is not None else f"from-secret-or-pod-{name.lower()}")
    settings = _settings_class(service)()

    assert settings.host == "0.0.0.0", f"{prefix}_HOST must be 0.0.0.0 inside Kubernetes"
    assert settings.port == default_port
    http = _ports(container)["http"]
    assert http == settings.port
    annotations = pod_template(workload)["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["command"] == [service, "serve"]

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod_template(workload)["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(pre_stop[1]) + settings.shutdown_grace, "SIGTERM grace must outlast preStop + shutdown"


@pytest.mark.parametrize(("service", "replicas"), [("timesvc", 3), ("leasewatch", 2)])
def test_prod_replicas_and_spread(rendered_all: dict[str, Rendered], service: str, replicas: int) -> None:
    prod = rendered_all["prod"]
    workload = _workload(prod, service)
    assert workload["spec"]["replicas"] == replicas
    spreads = pod_template(workload)["spec"]["topologySpreadConstraints"]
    by_host = [s for s in spreads if s["topologyKey"] == "kubernetes.io/hostname"]
    assert by_host and by_host[0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert selector_matches(by_host[0]["labelSelector"], pod_labels(workload))
    assert workload["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ---- Cassandra and the schema Job -----------------------------------------------------------------


def _job(rendered: Rendered) -> dict[str, Any]:
    """The schema Job (dev also has a roles Job)."""
    jobs = [j for j in rendered.of_kind("Job") if pod_labels(j).get("app.kubernetes.io/name") == "chronolock-schema"]
    assert len(jobs) == 1, f"{rendered.overlay}: one schema Job expected"
    return jobs[0]


def _job_option(job: dict[str, Any], option: str) -> str:
    args = containers(job)[0]["args"]
    assert args.count(option) == 1, f"{option} not given exactly once in {args}"
    return str(args[args.index(option) + 1])


def _cassandra_replicas(rendered: Rendered) -> int:
    return int(_workload(rendered, "cassandra")["spec"]["replicas"])


def test_cassandra_datacenter_is_consistent(rendered: Rendered) -> None:
    """Store URL ?dc=, schema --datacenter and CASSANDRA_DC all name the same DC."""
    from lockclient.store.url import parse_store_url

    cassandra = _container(_workload(rendered, "cassandra"), "cassandra")
    assert _env_value(cassandra, "CASSANDRA_ENDPOINT_SNITCH") == "GossipingPropertyFileSnitch"
    dc = _env_value(cassandra, "CASSANDRA_DC")
    assert _env_value(cassandra, "CASSANDRA_RACK")
    url = parse_store_url(str(_configmap_data(rendered, "chronolock-store")["CHRONOLOCK_STORE_URL"]))
    assert url.scheme == "cassandra"
    assert url.options.get("dc") == dc
    assert _job_option(_job(rendered), "--datacenter") == dc
    # The contact point is a Service that selects the Cassandra pods, on its CQL port.
    for host in url.hosts:
        service = rendered.one("Service", host.split(".")[0])
        assert _workload(rendered, "cassandra") in _selected(rendered, service["spec"]["selector"], plain=True)
        assert url.port in [p["port"] for p in service["spec"]["ports"]]
    assert not url.username and not url.password, "credentials come from the Secret, not the URL"


def test_schema_job(rendered: Rendered) -> None:
    job = _job(rendered)
    spec = job["spec"]
    assert spec["backoffLimit"] >= 6, "back-off must cover Cassandra still bootstrapping"
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    container = containers(job)[0]
    assert container["command"] == ["lockctl"] and container["args"][0] == "schema"
    assert _job_option(job, "--strategy") == "NetworkTopologyStrategy"
    rf = int(_job_option(job, "--replication-factor"))
    nodes = _cassandra_replicas(rendered)
    assert 1 <= rf <= nodes, f"RF {rf} with {nodes} Cassandra node(s)"
    if rendered.overlay == "prod":
        assert rf == nodes == 3


def test_schema_job_name_carries_schema_version(rendered: Rendered) -> None:
    try:
        schema = importlib.import_module("lockclient.store.cassandra_schema")
    except ModuleNotFoundError:
        pytest.fail("lockclient.store.cassandra_schema (SCHEMA_VERSION) is missing; the Job name must carry it")
    version = schema.SCHEMA_VERSION
    assert _job(rendered)["metadata"]["name"] == f"chronolock-schema-v{version}"


def test_cassandra_statefulset(rendered: Rendered) -> None:
    statefulset = _workload(rendered, "cassandra")
    spec = statefulset["spec"]
    nodes = int(spec["replicas"])
    if rendered.overlay == "prod":
        assert nodes == 3
    peers = rendered.one("Service", spec["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["volumeClaimTemplates"], "data must live on persistent volumes"
    mounts = {m["name"]: m["mountPath"] for m in _container(statefulset, "cassandra")["volumeMounts"]}
    assert mounts[spec["volumeClaimTemplates"][0]["metadata"]["name"]] == "/var/lib/cassandra"

    cassandra = _container(statefulset, "cassandra")
    seeds = _env_value(cassandra, "CASSANDRA_SEEDS").split(",")
    for seed in seeds:
        match = re.fullmatch(rf"cassandra-(\d+)\.{re.escape(peers['metadata']['name'])}(\.[\w.-]+)?", seed)
        assert match and int(match.group(1)) < nodes, f"seed {seed} is not a stable pod name of this StatefulSet"
    assert "cassandra-0." + peers["metadata"]["name"] in seeds[0]
    assert cassandra["lifecycle"]["preStop"]["exec"]["command"] == ["nodetool", "drain"]
    assert cassandra["readinessProbe"]["tcpSocket"]["port"] in ("cql", 9042)

    heap = _quantity(_env_value(cassandra, "MAX_HEAP_SIZE"))
    new = _quantity(_env_value(cassandra, "HEAP_NEWSIZE"))
    limit = _quantity(cassandra["resources"]["limits"]["memory"])
    assert new < heap
    assert limit >= 1.5 * heap, f"memory limit {limit:.0f} B is not comfortably above the heap {heap:.0f} B"
    assert _quantity(cassandra["resources"]["requests"]["memory"]) == limit, "memory request == limit"

    pdb = next(
        p for p in rendered.of_kind("PodDisruptionBudget") if statefulset in _selected(rendered, p["spec"]["selector"])
    )
    assert pdb["spec"]["maxUnavailable"] == 1
    grace = pod_template(statefulset)["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 60, "nodetool drain needs time"


# ---- Kubernetes service links (issue 25) ----------------------------------------------------------


def _service_links(rendered: Rendered) -> dict[str, str]:
    """The variables the kubelet gives every pod of the namespace when enableServiceLinks is on
    (pkg/kubelet/envvars/envvars.go), for the rendered Services, with made-up cluster IPs."""
    links: dict[str, str] = {}
    for index, service in enumerate(rendered.of_kind("Service")):
        spec = service["spec"]
        if spec.get("clusterIP") == "None":
            continue  # headless: the kubelet gives it no variables
        ip = spec.get("clusterIP") or f"10.96.0.{10 + index}"
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = spec["ports"]
        links[f"{name}_SERVICE_HOST"] = ip
        links[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                links[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
        for position, port in enumerate(ports):
            protocol = port.get("protocol", "TCP")
            url = f"{protocol.lower()}://{ip}:{port['port']}"
            if position == 0:
                links[f"{name}_PORT"] = url
            prefix = f"{name}_PORT_{port['port']}_{protocol.upper()}"
            links |= {
                prefix: url,
                f"{prefix}_PROTO": protocol.lower(),
                f"{prefix}_PORT": str(port["port"]),
                f"{prefix}_ADDR": ip,
            }
    return links


def test_pods_get_no_service_links(rendered: Rendered) -> None:
    """Docker-link variables of the namespace's Services (TIMESVC_PORT=tcp://..., LEASEWATCH_SERVICE_HOST)
    share the settings' prefixes; no pod asks for them."""
    for workload in rendered.workloads():
        spec = pod_template(workload)["spec"]
        assert spec.get("enableServiceLinks") is False, f"{rendered.overlay} {workload['metadata']['name']}"


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("own_port", [True, False], ids=["port-in-spec", "port-from-default"])
def test_services_start_with_service_links_turned_on(
    rendered: Rendered, service: str, own_port: bool, clean_env: pytest.MonkeyPatch
) -> None:
    """If an overlay turns links back on, the pod still starts: the links are recognised (unknown
    variables are refused otherwise), and TIMESVC_PORT=tcp://... is not read as the port — also
    when the pod spec does not set the port itself, so that the link is all there is."""
    container = _container(_workload(rendered, service), service)
    prefix, default_port = SERVICES[service]
    links = _service_links(rendered)
    assert {"TIMESVC_PORT", "LEASEWATCH_PORT", "TIMESVC_SERVICE_PORT_HTTP", "LEASEWATCH_PORT_8710_TCP_ADDR"} <= set(
        links
    ), "precondition: the Services give links with the settings' prefixes"
    provided = _provided_env(rendered, container)
    if not own_port:
        del provided[f"{prefix}_PORT"]
    # The kubelet's order: a variable the pod spec sets wins over a link of the same name.
    for name, value in {**links, **provided}.items():
        clean_env.setenv(name, value if value is not None else f"from-secret-or-pod-{name.lower()}")
    settings = _settings_class(service)()
    assert settings.port == default_port == _ports(container)["http"]


def test_a_client_pod_with_service_links_on_reads_its_settings(
    rendered: Rendered, clean_env: pytest.MonkeyPatch
) -> None:
    """An application pod in the namespace (RemoteLocker.from_env(), lockctl) with links on."""
    from lockclient.settings import ClientSettings

    for name, value in _service_links(rendered).items():
        clean_env.setenv(name, value)
    clean_env.setenv("CHRONOLOCK_STORE_URL", "cassandra://cassandra-client:9042/chronolock?dc=dc1")
    clean_env.setenv("CHRONOLOCK_TIMESVC_URLS", "http://timesvc:8700")
    assert ClientSettings().timesvc_urls == "http://timesvc:8700"
