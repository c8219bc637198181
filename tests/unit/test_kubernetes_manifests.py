"""deploy/kubernetes renders with kubectl's own kustomize, and every document it makes is one a
Kubernetes 1.32 API server would accept (the API's published schemas, strict: a misspelt field
fails), checked offline; then what makes it safe to run: non-root read-only containers, probes on
APISIX's status API, secrets only by reference, a NetworkPolicy, an HPA whose maxReplicas is
shared_state.nodes_expected, and the headless Service the on-prem discovery reads."""

from __future__ import annotations

import copy
import functools
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs, no py.typed
import pytest
import yaml

from devtools.apisix import ApisixSettings, config_yaml
from gateway_plugin.config import SpillwayConfig, parse
from tests.conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
HELM_VALUES = ROOT / "deploy" / "helm" / "apisix-values.yaml"
# The base and every overlay: each must render and validate on its own.
KUSTOMIZATIONS = sorted(path.parent.relative_to(ROOT) for path in DEPLOY.rglob("kustomization.yaml"))
KUBERNETES_VERSION = "1.32"
KUBECTL_HINT = "kubectl is not installed (apt-get install kubernetes-client; scripts/setup.sh installs it)"
GATEWAY = {"app.kubernetes.io/name": "spillway-gateway"}
REDIS = {"app.kubernetes.io/name": "spillway-redis"}
# What the gateway, Redis and the warm-up read from their environment that must stay secret.
SECRET_ENV = {
    "SPILLWAY_ROUTE_TOKEN",
    "SPILLWAY_SIGNING_KEY",
    "SPILLWAY_REDIS_PASSWORD",
    "REDIS_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "ALIBABA_CLOUD_ACCESS_KEY_ID",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_SECURITY_TOKEN",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
Doc = dict[str, Any]


def kubectl() -> str:
    """kubectl, whose built-in kustomize is what users render with; CI must have it."""
    found = shutil.which("kubectl")
    if found is None:
        if in_ci():
            pytest.fail(f"{KUBECTL_HINT}: CI must render and validate deploy/kubernetes")
        pytest.skip(KUBECTL_HINT)
    return found


@functools.cache
def _rendered_text(kustomization: Path) -> str:
    done = subprocess.run(
        [kubectl(), "kustomize", str(kustomization)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize {kustomization} failed: {done.stderr}"
    return done.stdout


def rendered(kustomization: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(_rendered_text(kustomization)) if doc]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    """Every pod template's spec, named by its workload."""
    for doc in docs:
        if doc["kind"] == "CronJob":
            yield doc["metadata"]["name"], doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif doc["kind"] in WORKLOADS:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def gateway_container(docs: list[Doc]) -> Doc:
    spec = one(docs, "Deployment", "spillway-gateway")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "gateway")


def config_file(docs: list[Doc], prefix: str, key: str) -> Any:
    """A file of a generated ConfigMap (its name carries kustomize's hash suffix)."""
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix + "-")]
    assert len(maps) == 1, f"one ConfigMap {prefix}-<hash> expected"
    return yaml.safe_load(maps[0]["data"][key])


def spillway_config(docs: list[Doc]) -> SpillwayConfig:
    return parse(config_file(docs, "spillway-config", "spillway.yaml"), "spillway.yaml in the ConfigMap")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def validation_errors(docs: list[Doc]) -> list[str]:
    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {getattr(exc, 'message', exc)}")
    return errors


@pytest.fixture(params=KUSTOMIZATIONS, ids=str)
def docs(request: pytest.FixtureRequest) -> list[Doc]:
    path: Path = request.param
    return rendered(path)


def test_there_is_a_base_to_render() -> None:
    """The parametrised tests below would pass vacuously without one."""
    assert Path("deploy/kubernetes/base") in KUSTOMIZATIONS


def test_every_document_is_accepted_by_kubernetes_1_32(docs: list[Doc]) -> None:
    """What `kubectl apply` would send is valid against 1.32's schemas, unknown fields refused."""
    assert not validation_errors(docs)
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "StatefulSet",
        "CronJob",
    } <= kinds


def test_strict_validation_refuses_what_a_cluster_would(docs: list[Doc]) -> None:
    """The validator runs offline and does fail: a misspelt field and a wrong type are caught."""
    deployment = copy.deepcopy(one(docs, "Deployment", "spillway-gateway"))
    deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailabel"] = 1
    assert validation_errors([deployment])
    hpa = copy.deepcopy(one(docs, "HorizontalPodAutoscaler"))
    hpa["spec"]["maxReplicas"] = "four"
    assert validation_errors([hpa])


def test_every_container_is_non_root_and_read_only(docs: list[Doc]) -> None:
    """Each would pass the restricted Pod Security Standard the namespace enforces, and has
    resources a scheduler and a quota can count."""
    specs = list(pod_specs(docs))
    assert {name for name, _ in specs} >= {"spillway-gateway", "redis", "spillway-warmup"}
    for name, spec in specs:
        pod = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, name
        for container in containers(spec):
            where, own = f"{name}/{container['name']}", container.get("securityContext", {})
            assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, where
            assert own.get("runAsUser", pod.get("runAsUser", 0)) > 0, where
            assert own.get("readOnlyRootFilesystem") is True, where
            assert own.get("allowPrivilegeEscalation") is False, where
            assert own.get("capabilities", {}).get("drop") == ["ALL"], where
            seccomp = own.get("seccompProfile", pod.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where
            for bound in ("requests", "limits"):
                assert set(container.get("resources", {}).get(bound, {})) >= {"cpu", "memory"}, where
    namespace = one(docs, "Namespace", "spillway")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_gateway_probes_apisix_status_api_and_writes_only_to_empty_dirs(docs: list[Doc]) -> None:
    """Readiness on /status/ready, liveness on /status, at the port config.yaml opens on the pod's
    address; conf, logs and /tmp (what APISIX and the runner write) are emptyDirs."""
    container = gateway_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    status = config_file(docs, "spillway-apisix-config", "config.yaml")["apisix"]["status"]
    assert status == {"ip": "0.0.0.0", "port": 7085} and ports["status"] == 7085
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (ready["path"], ready["port"]) == ("/status/ready", "status")
    assert (live["path"], live["port"]) == ("/status", "status")
    spec = one(docs, "Deployment", "spillway-gateway")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/usr/local/apisix/conf", "/usr/local/apisix/logs", "/tmp"):
        assert "emptyDir" in volumes[mounts[path]], path
    configs = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for path in ("/usr/local/apisix/conf/config.yaml", "/etc/spillway"):
        assert volumes[mounts[path]]["configMap"]["name"] in configs, path
    assert volumes[mounts["/usr/local/apisix/conf/apisix.yaml"]]["secret"]["secretName"]


def test_secrets_come_from_secret_references_only(docs: list[Doc]) -> None:
    """Every secret the pods read is a secretKeyRef, an envFrom secretRef or a secret volume; and
    every variable APISIX hands the runner (nginx_config.envs) is one the pod has."""
    for name, spec in pod_specs(docs):
        for container in containers(spec):
            for env in container.get("env", []):
                if env["name"] in SECRET_ENV or re.search(r"TOKEN|SECRET|PASSWORD|_KEY", env["name"]):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], (name, env["name"])
            for source in container.get("envFrom", []):
                assert set(source) <= {"secretRef", "prefix"}, (name, source)
    gateway = gateway_container(docs)
    envs = config_file(docs, "spillway-apisix-config", "config.yaml")["nginx_config"]["envs"]
    given = {e["name"] for e in gateway["env"]}
    from_secret = [s for s in gateway.get("envFrom", []) if "secretRef" in s]
    for variable in envs:
        assert variable in given or (variable.startswith(("AWS_", "ALIBABA_")) and from_secret), variable
    config = spillway_config(docs)
    named = {config.runner.route_token_env, *(t.signing_key_env for t in config.targets)}
    assert config.shared_state is not None
    named.add(config.shared_state.password_env)
    assert {n for n in named if n} <= set(envs) & given


def test_the_rendered_output_holds_no_literal_secret(docs: list[Doc]) -> None:
    """No Secret object, no example token and nothing that looks like a key or a derived header:
    the output can be committed, diffed and shown in CI logs."""
    assert not [d for d in docs if d["kind"] == "Secret"]
    text = "\n".join(yaml.safe_dump(d) for d in docs)
    for pattern in (
        r"example-route-token",
        r"auth_header",
        r"Spillway [0-9a-f]{16,}",
        r"AKIA[0-9A-Z]{16}",
        r"LTAI[0-9A-Za-z]{12,}",
        r"-----BEGIN",
        r"://[^/\s'\"]*:[^/\s'\"]*@",
        r"stringData",
    ):
        assert not re.search(pattern, text), pattern
    for name, spec in pod_specs(docs):
        for container in containers(spec):
            literal = {e["name"]: e.get("value", "") for e in container.get("env", [])}
            assert not any(
                re.fullmatch(r"[0-9a-f]{32,}|[A-Za-z0-9+/]{40,}=*", v) for v in literal.values()
            ), name
            words = [*container.get("command", []), *container.get("args", [])]
            for flag, value in itertools.pairwise(words):
                if flag == "--requirepass":  # Redis's password: a $(VAR) Kubernetes fills from a Secret
                    variable = re.fullmatch(r"\$\(([A-Z_]+)\)", value)
                    assert variable, f"{name}: a literal Redis password"
                    env = next(e for e in container["env"] if e["name"] == variable[1])
                    assert "secretKeyRef" in env["valueFrom"], name


def test_the_network_policy_confines_the_gateway(docs: list[Doc]) -> None:
    """It selects the gateway pods, lets clients reach APISIX's port, and lets out only DNS, the
    Triton pods, Redis and HTTPS to the cloud."""
    labels = one(docs, "Deployment", "spillway-gateway")["spec"]["template"]["metadata"]["labels"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    policy = next(p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"], labels))
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    ingress_ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert 9080 in ingress_ports and 7085 not in ingress_ports
    triton = one(docs, "Service", "triton")
    redis_pods = one(docs, "StatefulSet", "redis")["spec"]["template"]["metadata"]["labels"]
    seen = set()
    for rule in policy["spec"]["egress"]:
        ports = {p["port"] for p in rule["ports"]}
        peers = rule["to"]
        if ports == {53}:
            seen.add("dns")
        elif all("ipBlock" in peer for peer in peers):
            assert ports == {443}, "the cloud: HTTPS only"
            seen.add("cloud")
        elif any(selects(p.get("podSelector", {}).get("matchLabels", {}), redis_pods) for p in peers):
            assert ports == {6379}
            seen.add("redis")
        else:
            peer = peers[0]
            assert peer["podSelector"]["matchLabels"] == triton["spec"]["selector"]
            namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            assert namespace == triton["metadata"]["namespace"]
            assert ports == {p["port"] for p in triton["spec"]["ports"]}
            seen.add("triton")
    assert seen == {"dns", "cloud", "redis", "triton"}
    redis_policy = next(p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"], redis_pods))
    peers = redis_policy["spec"]["ingress"][0]["from"]
    assert [p["podSelector"]["matchLabels"] for p in peers] == [GATEWAY]


def test_the_autoscaler_and_the_disruption_budget_hold_the_gateway(docs: list[Doc]) -> None:
    """The HPA scales the gateway Deployment (which leaves its replica count to it) and the PDB
    selects exactly its pods."""
    deployment = one(docs, "Deployment", "spillway-gateway")
    target = one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "spillway-gateway"}
    assert "replicas" not in deployment["spec"], "kubectl apply would undo the HPA's count"
    pdb = one(docs, "PodDisruptionBudget")["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert selects(pdb["selector"]["matchLabels"], labels)
    service = one(docs, "Service", "spillway-gateway")["spec"]
    assert selects(service["selector"], labels) and service["ports"][0]["targetPort"] == "http"


def test_nodes_expected_is_the_autoscaler_s_ceiling(docs: list[Doc]) -> None:
    """While Redis is away each runner keeps 1/nodes_expected of every budget and cap: with more
    runners than that the budgets overshoot. So nodes_expected is the HPA's maxReplicas and a
    rollout adds no pod above it (deploy/kubernetes/README.md)."""
    config = spillway_config(docs)
    assert config.shared_state is not None
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert config.shared_state.nodes_expected == hpa["maxReplicas"] >= hpa["minReplicas"]
    strategy = one(docs, "Deployment", "spillway-gateway")["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxSurge"] == 0
    redis = one(docs, "Service", "redis")
    host = f"{redis['metadata']['name']}.{redis['metadata']['namespace']}.svc.cluster.local:6379"
    assert config.shared_state.redis_url.startswith(f"redis://{host}/")


def test_the_headless_service_is_what_the_discovery_reads(docs: list[Doc]) -> None:
    """clusterIP None (one A record per ready pod), with the name and ports local.discovery.dns
    names; every other object is in the spillway namespace."""
    service = one(docs, "Service", "triton")
    assert service["spec"]["clusterIP"] == "None"
    dns = spillway_config(docs).local.discovery.dns
    assert dns is not None and dns.resolver is None
    meta = service["metadata"]
    assert dns.name == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert (ports["http"], ports["metrics"]) == (dns.port, dns.metrics_port)
    apisix = config_file(docs, "spillway-apisix-config", "config.yaml")
    assert apisix["discovery"] == {"dns": {"resolv_conf": "/etc/resolv.conf"}}
    for doc in docs:
        if doc["kind"] != "Namespace" and doc is not service:
            assert doc["metadata"].get("namespace") == "spillway", doc["metadata"]["name"]


def test_the_helm_values_run_the_same_runner() -> None:
    """deploy/helm/apisix-values.yaml starts the runner as the kustomize layout does and passes it
    the same variables, from Secrets."""
    values = yaml.safe_load(HELM_VALUES.read_text())
    base = yaml.safe_load((DEPLOY / "base" / "config" / "config.yaml").read_text())
    assert values["apisix"]["extPlugin"] == {"enabled": True, "cmd": base["ext-plugin"]["cmd"]}
    assert values["apisix"]["nginx"]["envs"] == base["nginx_config"]["envs"]
    assert values["apisix"]["plugins"] == base["plugins"]
    assert values["apisix"]["customPlugins"]["luaPath"] == base["apisix"]["extra_lua_path"]
    given = {e["name"]: e for e in values["extraEnvVars"]}
    for variable in base["nginx_config"]["envs"]:
        assert "secretKeyRef" in given[variable]["valueFrom"], variable
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    policy = yaml.safe_load((DEPLOY / "base" / "config" / "spillway.yaml").read_text())
    assert values["autoscaling"]["maxReplicas"] == policy["shared_state"]["nodes_expected"]
    assert values["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    image = f"{values['image']['repository']}:{values['image']['tag']}"
    assert [c["image"] for c in values["extraInitContainers"]] == [image], "the init container's image"


def test_the_gateway_reads_its_routes_from_the_mounted_file() -> None:
    """Standalone as every real-APISIX test runs it (devtools.apisix, without etcd): a data plane
    reading conf/apisix.yaml. Under role traditional, config_provider yaml is APISIX's API-driven
    standalone mode, which keeps the Admin API on and ignores the mounted routes: every request
    would be a 404. The Helm chart writes the same section from role data_plane and mode
    standalone."""
    base = yaml.safe_load((DEPLOY / "base" / "config" / "config.yaml").read_text())
    tested = yaml.safe_load(config_yaml(ApisixSettings(port=1, routes_yaml="")))
    assert base["deployment"] == tested["deployment"]
    assert "enable_admin" not in base["apisix"] or base["apisix"]["enable_admin"] is False
    chart = yaml.safe_load(HELM_VALUES.read_text())["apisix"]["deployment"]
    assert (chart["mode"], chart["role"]) == ("standalone", "data_plane")
    assert "role_traditional" not in chart


def test_a_missing_kubectl_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI must validate the manifests: there a missing kubectl is a failure, not a skip."""
    monkeypatch.setenv("PATH", os.devnull)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="kubectl is not installed"):
        kubectl()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="kubectl is not installed"):
        kubectl()
