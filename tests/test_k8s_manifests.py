"""The Kubernetes manifests: every kustomization renders, and every object validates offline.

Schemas: the Kubernetes 1.29 OpenAPI schemas as JSON Schema, in their strict form (unknown
fields are errors), bundled by the ``kubernetes-validate`` package (nothing is fetched); 1.29
is the oldest version the manifests support (native sidecars are on by default from 1.29).
cert-manager objects are checked against strict subsets of cert-manager's v1 CRD schemas,
written out below.

On top of the schemas, the checks the API server would make that JSON Schema cannot express
(names that must be unique, mounts of volumes that exist, selectors that select), and the
security baseline the manifests promise.
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from llm_gateway.cli import build_parser
from llm_gateway.k8s import (
    INJECT_KEY,
    NAMESPACE_OPT_IN_VALUE,
    SIDECAR_CONTAINER_NAME,
    SIDECAR_UID,
    InjectorSettings,
    create_injector_app,
    mutate_pod,
)

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "k8s"
DOCS = REPO / "docs" / "kubernetes.md"
# The oldest Kubernetes the manifests support; they are also checked against the newest
# schemas the package bundles, so that nothing they use has been removed since.
KUBERNETES_VERSION = "1.29.0"
NEWEST_BUNDLED_VERSION = max(
    (
        entry.name[1:].removesuffix("-local-strict")
        for entry in (
            importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
        ).iterdir()
        if entry.name.endswith("-local-strict")
    ),
    key=lambda version: tuple(int(part) for part in version.split(".")),
)
IMAGE_NAME = "llm-gateway"
# Secrets that the platform engineer creates (docs/kubernetes.md says how); every other
# Secret a manifest refers to must be rendered by the same kustomization or by cert-manager.
USER_CREATED_SECRETS = {
    "llm-gateway-provider",
    "llm-gateway-datastores",
    # Optional (METRICS_TOKEN): referred to with optional: true, made by the dev overlay.
    "llm-gateway-metrics",
    "llm-gateway-provider-admin",
    "llm-gateway-injector-tls",
    "example-app-gateway-key",
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}


def _kustomization_kind(directory: Path) -> str:
    return yaml.safe_load((directory / "kustomization.yaml").read_text()).get("kind", "")


# Every directory that `kubectl kustomize` can render on its own (components cannot).
KUSTOMIZATIONS = sorted(
    path.parent.relative_to(K8S).as_posix()
    for path in K8S.rglob("kustomization.yaml")
    if _kustomization_kind(path.parent) != "Component"
)
OVERLAYS = [name for name in KUSTOMIZATIONS if name.startswith("overlays/")]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("kubectl is required in CI to render the manifests (`kubectl kustomize`)")
    pytest.skip("kubectl is not installed: cannot render the kustomizations")


@functools.cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(K8S / directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize k8s/{directory}:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(directory: str) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(doc)) for doc in _render(directory)]


# --- schema validation (used by test_injector.py too) ----------------------------------------


@functools.cache
def _definitions(version: str) -> tuple[Any, Registry]:
    schemas = (
        importlib.resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{version}-local-strict"
    )
    if not schemas.is_dir():
        pytest.fail(
            f"the installed kubernetes-validate no longer bundles the v{version} schemas: "
            "pin a release that does (1.37.0 bundles v1.25 to v1.37)"
        )
    definitions = json.loads((schemas / "_definitions.json").read_text())
    return schemas, Resource.from_contents(definitions) @ Registry()


@functools.cache
def _kubernetes_validator(version: str, kind: str, api_version: str) -> Draft202012Validator | None:
    schemas, registry = _definitions(version)
    # rbac.authorization.k8s.io/v1 -> rbac-v1, v1 -> v1: the bundle's file naming.
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_file = schemas / f"{kind.lower()}-{group_version}.json"
    if not schema_file.is_file():
        return None
    schema = json.loads(schema_file.read_text())
    return Draft202012Validator(schema, registry=Resource.from_contents(schema) @ registry)


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{metadata.get('namespace', '-')}/{metadata.get('name')}"


_OBJECT_META = {
    "$ref": "https://kubernetes.io/api/_definitions.json#/$defs/"
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
}
# A Go duration, as cert-manager parses it (e.g. 2160h, 1h30m).
GO_DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
_STRINGS = {"type": "array", "items": {"type": "string"}}
_KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing", "email protection",
    "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping",
    "ocsp signing", "microsoft sgc", "netscape sgc",
]  # fmt: skip
_ISSUER_REF = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                   "group": {"type": "string"}},
}  # fmt: skip


def _resource_schema(api_kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://cert-manager.io/schemas/{api_kind.lower()}-v1",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": api_kind},
            "metadata": _OBJECT_META,
            "spec": spec,
        },
    }


# cert-manager's CRDs are in no package that installs cleanly here (the one PyPI package
# that compiles them, cloudcoil-models-cert-manager, brings a pytest plugin that breaks
# collection), so these are strict subsets of the cert-manager.io/v1 Issuer and Certificate
# CRD schemas (cert-manager 1.12+ API reference): the fields these manifests may use, with
# their types and enums. A field outside the subset fails, like a typo would.
_ISSUER_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "selfSigned": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"crlDistributionPoints": _STRINGS},
        },
        "ca": {
            "type": "object",
            "additionalProperties": False,
            "required": ["secretName"],
            "properties": {
                "secretName": {"type": "string"},
                "crlDistributionPoints": _STRINGS,
                "ocspServers": _STRINGS,
                "issuingCertificateURLs": _STRINGS,
            },
        },
    },
}
_CERTIFICATE_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["secretName", "issuerRef"],
    "properties": {
        "secretName": {"type": "string"},
        "issuerRef": _ISSUER_REF,
        "commonName": {"type": "string", "maxLength": 64},
        "dnsNames": _STRINGS,
        "ipAddresses": _STRINGS,
        "uris": _STRINGS,
        "emailAddresses": _STRINGS,
        "duration": {"type": "string", "pattern": GO_DURATION},
        "renewBefore": {"type": "string", "pattern": GO_DURATION},
        "isCA": {"type": "boolean"},
        "usages": {"type": "array", "items": {"enum": _KEY_USAGES}},
        "revisionHistoryLimit": {"type": "integer", "minimum": 1},
        "secretTemplate": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "privateKey": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "encoding": {"enum": ["PKCS1", "PKCS8"]},
                "rotationPolicy": {"enum": ["Never", "Always"]},
            },
        },
    },
}
_CERT_MANAGER_SCHEMAS = {
    "Issuer": _resource_schema("Issuer", _ISSUER_SPEC),
    "ClusterIssuer": _resource_schema("ClusterIssuer", _ISSUER_SPEC),
    "Certificate": _resource_schema("Certificate", _CERTIFICATE_SPEC),
}


def _cert_manager_errors(obj: Mapping[str, Any]) -> list[str]:
    schema = _CERT_MANAGER_SCHEMAS.get(str(obj.get("kind")))
    if schema is None or obj.get("apiVersion") != "cert-manager.io/v1":
        return [f"{_name(obj)}: no cert-manager schema for {obj.get('apiVersion')}"]
    _, registry = _definitions(KUBERNETES_VERSION)
    validator = Draft202012Validator(schema, registry=registry)
    return [
        f"{_name(obj)} at {'.'.join(map(str, error.absolute_path)) or '.'}: {error.message}"
        for error in validator.iter_errors(obj)
    ]


CRD_VALIDATORS = {"cert-manager.io": _cert_manager_errors}


def schema_errors(obj: Mapping[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Every way ``obj`` breaks its schema (Kubernetes ``version`` strict, or its CRD's)."""
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rpartition("/")[0]
    if group in CRD_VALIDATORS:
        return CRD_VALIDATORS[group](obj)
    validator = _kubernetes_validator(version, str(obj.get("kind", "")), api_version)
    if validator is None:
        return [f"{_name(obj)}: no Kubernetes {version} schema for {api_version}"]
    return [
        f"{_name(obj)} at {'.'.join(map(str, error.absolute_path)) or '.'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
    ]


def pod_spec_errors(spec: Mapping[str, Any], where: str) -> list[str]:
    """What the API server rejects in a pod spec that JSON Schema cannot see."""
    errors: list[str] = []
    init_containers = spec.get("initContainers") or []
    containers = spec.get("containers") or []
    if not containers:
        errors.append(f"{where}: no containers")
    names = [c.get("name") for c in [*init_containers, *containers]]
    if len(names) != len(set(names)):
        errors.append(f"{where}: duplicate container names {names}")
    volume_names = [v.get("name") for v in spec.get("volumes") or []]
    if len(volume_names) != len(set(volume_names)):
        errors.append(f"{where}: duplicate volume names {volume_names}")
    for volume in spec.get("volumes") or []:
        sources = set(volume) - {"name"}
        if len(sources) != 1:
            errors.append(f"{where}: volume {volume.get('name')} has sources {sorted(sources)}")
    for container in [*init_containers, *containers]:
        label = f"{where} container {container.get('name')}"
        is_sidecar = container in init_containers and container.get("restartPolicy") == "Always"
        if "restartPolicy" in container and not is_sidecar:
            errors.append(f"{label}: restartPolicy is only for init containers, as Always")
        if container in init_containers and not is_sidecar:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container:
                    errors.append(f"{label}: init containers may not have a {probe}")
        mounts = container.get("volumeMounts") or []
        for mount in mounts:
            if mount.get("name") not in volume_names:
                errors.append(f"{label}: mounts undefined volume {mount.get('name')}")
        paths = [m.get("mountPath") for m in mounts]
        if len(paths) != len(set(paths)):
            errors.append(f"{label}: duplicate mount paths {paths}")
        env_names = [item.get("name") for item in container.get("env") or []]
        if len(env_names) != len(set(env_names)):
            errors.append(f"{label}: duplicate env names {env_names}")
        port_names = {p.get("name") for p in container.get("ports") or [] if p.get("name")}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            handler = (container.get(probe) or {}).get("httpGet") or {}
            port = handler.get("port")
            if isinstance(port, str) and port not in port_names:
                errors.append(f"{label}: {probe} uses undeclared port name {port}")
    return errors


def security_baseline_errors(spec: Mapping[str, Any], where: str) -> list[str]:
    """The baseline the manifests promise: non-root, no escalation, no capabilities, sized."""
    errors: list[str] = []
    pod_context = spec.get("securityContext") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        label = f"{where} container {container.get('name')}"
        context = container.get("securityContext") or {}
        run_as_non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if run_as_non_root is not True:
            errors.append(f"{label}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            errors.append(f"{label}: runs as uid 0")
        if context.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{label}: allowPrivilegeEscalation is not false")
        if (context.get("capabilities") or {}).get("drop") != ["ALL"]:
            errors.append(f"{label}: capabilities do not drop ALL")
        if context.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{label}: root file system is writable")
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(kind) or {}):
                    errors.append(f"{label}: no {resource} {kind[:-1]}")
        image = str(container.get("image", ""))
        if ":" not in image.rpartition("/")[2] or image.endswith(":latest"):
            errors.append(f"{label}: image {image!r} has no pinned tag")
    return errors


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """A workload's pod template (a CronJob's is its Job template's)."""
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    return spec["template"]  # type: ignore[no-any-return]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict]]:
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            yield obj, pod_template(obj)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    match_labels = selector.get(
        "matchLabels", selector if "matchExpressions" not in selector else {}
    )
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        value, values = labels.get(expression["key"]), expression.get("values") or []
        operator = expression["operator"]
        if (
            (operator == "In" and value not in values)
            or (operator == "NotIn" and value in values)
            or (operator == "Exists" and value is None)
            or (operator == "DoesNotExist" and value is not None)
        ):
            return False
    return True


# --- tests ------------------------------------------------------------------------------------


def test_the_expected_kustomizations_exist() -> None:
    assert {"base", "example-app", "overlays/cert-manager", "overlays/dev"} <= set(KUSTOMIZATIONS)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", sorted({KUBERNETES_VERSION, NEWEST_BUNDLED_VERSION}))
def test_every_object_validates_against_the_schemas(directory: str, version: str) -> None:
    objects = render(directory)
    assert objects, f"k8s/{directory} rendered nothing"
    errors = [error for obj in objects for error in schema_errors(obj, version)]
    for obj in objects:
        if obj["kind"] == "Pod":
            errors += pod_spec_errors(obj["spec"], _name(obj))
    for obj, template in pod_templates(objects):
        errors += pod_spec_errors(template["spec"], _name(obj))
    assert not errors, "\n".join(errors)


def test_the_validator_is_not_vacuous() -> None:
    deployment = find(render("base"), "Deployment", "llm-gateway-injector")
    assert schema_errors(deployment) == []
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = 7
    container["readinesProbe"] = container.pop("readinessProbe")
    errors = schema_errors(deployment)
    assert any("imagePullPolicy" in e for e in errors), errors
    assert any("readinesProbe" in e for e in errors), errors
    certificate = find(render("overlays/cert-manager"), "Certificate", "llm-gateway-injector")
    assert schema_errors(certificate) == []
    assert schema_errors({**certificate, "spec": {**certificate["spec"], "isCa": True}})
    assert schema_errors({**certificate, "spec": {**certificate["spec"], "usages": ["nope"]}})
    assert schema_errors({"apiVersion": "example.com/v1", "kind": "Widget"})


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_workloads_meet_the_security_baseline(directory: str) -> None:
    errors: list[str] = []
    for obj, template in pod_templates(render(directory)):
        errors += security_baseline_errors(template["spec"], _name(obj))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_selectors_select_what_they_should(directory: str) -> None:
    objects = render(directory)
    errors: list[str] = []
    pods = [
        (obj["metadata"].get("namespace"), template["metadata"].get("labels") or {}, template)
        for obj, template in pod_templates(objects)
    ]
    for obj, template in pod_templates(objects):
        if obj["kind"] not in ("Job", "CronJob") and not _selects(
            obj["spec"]["selector"], template["metadata"]["labels"]
        ):
            errors.append(f"{_name(obj)}: selector does not match its template")
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] == "Service":
            selected = [
                t
                for ns, labels, t in pods
                if ns == namespace and _selects(obj["spec"]["selector"], labels)
            ]
            if not selected:
                errors.append(f"{_name(obj)}: selects no pods")
            for port in obj["spec"]["ports"]:
                target = port.get("targetPort")
                declared = {
                    p.get("name")
                    for t in selected
                    for c in t["spec"]["containers"]
                    for p in c.get("ports") or []
                }
                if isinstance(target, str) and target not in declared:
                    errors.append(f"{_name(obj)}: targetPort {target} is declared by no pod")
        if obj["kind"] == "PodDisruptionBudget" and not any(
            ns == namespace and _selects(obj["spec"]["selector"], labels) for ns, labels, _ in pods
        ):
            errors.append(f"{_name(obj)}: selects no pods")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_referenced_secrets_and_config_maps_exist_or_are_documented(directory: str) -> None:
    objects = render(directory)
    rendered = {(o["metadata"].get("namespace"), o["kind"], o["metadata"]["name"]) for o in objects}
    made_by_cert_manager = {
        (o["metadata"]["namespace"], "Secret", o["spec"]["secretName"])
        for o in objects
        if o["kind"] == "Certificate"
    }
    missing: list[str] = []
    for obj, template in pod_templates(objects):
        namespace = obj["metadata"]["namespace"]
        spec = template["spec"]
        references: set[tuple[str, str]] = set()
        for volume in spec.get("volumes") or []:
            if "secret" in volume:
                references.add(("Secret", volume["secret"]["secretName"]))
            if "configMap" in volume:
                references.add(("ConfigMap", volume["configMap"]["name"]))
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            for source in container.get("envFrom") or []:
                if "secretRef" in source:
                    references.add(("Secret", source["secretRef"]["name"]))
            for item in container.get("env") or []:
                key_ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if key_ref:
                    references.add(("Secret", key_ref["name"]))
        for kind, name in references:
            key = (namespace, kind, name)
            if key in rendered or key in made_by_cert_manager:
                continue
            if kind == "Secret" and name in USER_CREATED_SECRETS:
                continue
            missing.append(f"{_name(obj)} refers to {kind} {namespace}/{name}")
    assert not missing, "\n".join(missing)


def test_user_created_secrets_are_documented() -> None:
    text = DOCS.read_text()
    assert all(name in text for name in USER_CREATED_SECRETS)


@pytest.mark.parametrize("directory", ["base", *OVERLAYS])
def test_webhook_configuration(directory: str) -> None:
    objects = render(directory)
    injector = find(objects, "Deployment", "llm-gateway-injector")
    namespace = injector["metadata"]["namespace"]
    service = find(objects, "Service", "llm-gateway-injector")
    configuration = find(objects, "MutatingWebhookConfiguration", "llm-gateway-injector")
    assert injector["spec"]["replicas"] == 2
    budget = find(objects, "PodDisruptionBudget", "llm-gateway-injector")
    assert budget["spec"]["minAvailable"] == 1
    assert len(configuration["webhooks"]) == 2
    for webhook in configuration["webhooks"]:
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["sideEffects"] == "None"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        target = webhook["clientConfig"]["service"]
        assert (target["name"], target["namespace"]) == (service["metadata"]["name"], namespace)
        assert target["port"] in {port["port"] for port in service["spec"]["ports"]}
        # The injector's own namespace (and the system ones) never match.
        for excluded in [namespace, "kube-system"]:
            labels = {"kubernetes.io/metadata.name": excluded, INJECT_KEY: NAMESPACE_OPT_IN_VALUE}
            assert not _selects(webhook["namespaceSelector"], labels), (webhook["name"], excluded)
        assert not _selects(webhook["objectSelector"], {INJECT_KEY: "false"})
    by_path = {w["clientConfig"]["service"]["path"]: w for w in configuration["webhooks"]}
    assert set(by_path) == {"/mutate", "/mutate/annotated"}
    namespace_entry, pod_entry = by_path["/mutate"], by_path["/mutate/annotated"]
    opted_in = {"kubernetes.io/metadata.name": "team-a", INJECT_KEY: NAMESPACE_OPT_IN_VALUE}
    plain = {"kubernetes.io/metadata.name": "team-b"}
    assert _selects(namespace_entry["namespaceSelector"], opted_in)
    assert not _selects(namespace_entry["namespaceSelector"], plain)
    # A namespace is served by exactly one entry: no pod is reviewed twice.
    assert not _selects(pod_entry["namespaceSelector"], opted_in)
    assert _selects(pod_entry["namespaceSelector"], plain)
    assert "llm-gateway.io/inject" in pod_entry["matchConditions"][0]["expression"]


@pytest.mark.parametrize("directory", ["base", *OVERLAYS])
async def test_webhook_paths_are_served_by_the_injector(directory: str) -> None:
    configuration = find(render(directory), "MutatingWebhookConfiguration", "llm-gateway-injector")
    transport = httpx.ASGITransport(app=create_injector_app(InjectorSettings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://injector") as client:
        for webhook in configuration["webhooks"]:
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": webhook["name"],
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE",
                    "namespace": "team-a",
                    "object": {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []}},
                },
            }
            response = await client.post(webhook["clientConfig"]["service"]["path"], json=review)
            assert response.status_code == 200
            assert response.json()["response"]["uid"] == webhook["name"]


@pytest.mark.parametrize("directory", OVERLAYS)
def test_cert_manager_makes_the_injector_certificate(directory: str) -> None:
    objects = render(directory)
    configuration = find(objects, "MutatingWebhookConfiguration", "llm-gateway-injector")
    injector = find(objects, "Deployment", "llm-gateway-injector")
    service = find(objects, "Service", "llm-gateway-injector")
    namespace, name = configuration["metadata"]["annotations"][
        "cert-manager.io/inject-ca-from"
    ].split("/")
    certificate = next(
        o
        for o in objects
        if o["kind"] == "Certificate"
        and (o["metadata"]["namespace"], o["metadata"]["name"]) == (namespace, name)
    )
    mounted = {
        v["secret"]["secretName"]
        for v in injector["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert certificate["spec"]["secretName"] in mounted
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert host in certificate["spec"]["dnsNames"]


def _injector_settings(objects: list[dict[str, Any]]) -> InjectorSettings:
    injector = find(objects, "Deployment", "llm-gateway-injector")
    container = injector["spec"]["template"]["spec"]["containers"][0]
    environment = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    environment["POD_NAMESPACE"] = injector["metadata"]["namespace"]
    return InjectorSettings.from_env(environment)


@pytest.mark.parametrize("directory", ["base", *OVERLAYS])
def test_the_injector_injects_the_image_it_runs(directory: str) -> None:
    objects = render(directory)
    injector = find(objects, "Deployment", "llm-gateway-injector")
    settings = _injector_settings(objects)
    assert settings.sidecar_image == injector["spec"]["template"]["spec"]["containers"][0]["image"]
    assert settings.own_namespace == injector["metadata"]["namespace"]


def test_an_overlay_moving_the_image_moves_the_injected_image(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(K8S / "base", overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\n"
        "images:\n  - name: llm-gateway\n    newName: registry.example.com/llm-gateway\n"
        '    newTag: "9.9.9"\n'
    )
    result = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert _injector_settings(objects).sidecar_image == "registry.example.com/llm-gateway:9.9.9"
    gateway = find(objects, "Deployment", "llm-gateway")["spec"]["template"]["spec"]
    assert gateway["containers"][0]["image"] == "registry.example.com/llm-gateway:9.9.9"
    # Only the image variable moved, no other value in the Deployments.
    assert _injector_settings(objects).provider_secret == "llm-gateway-provider"


def _as_pod(template: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": dict(template["metadata"]),
        "spec": template["spec"],
    }
    pod["metadata"] |= {"generateName": "example-", "namespace": namespace}
    return json.loads(json.dumps(pod))


@pytest.mark.parametrize("directory", ["example-app", *OVERLAYS])
def test_the_hand_written_sidecar_is_what_the_injector_adds(directory: str) -> None:
    objects = render(directory)
    base_objects = render("base") if directory == "example-app" else objects
    settings = _injector_settings(base_objects)
    hand_written = find(objects, "Deployment", "example-app")
    injected = find(objects, "Deployment", "example-injected")
    namespace = injected["metadata"]["namespace"]
    namespace_labels = find(objects, "Namespace", namespace)["metadata"]["labels"]
    assert namespace_labels[INJECT_KEY] == NAMESPACE_OPT_IN_VALUE

    pod = _as_pod(injected["spec"]["template"], namespace)
    patch = mutate_pod(pod, namespace_labels, namespace=namespace, settings=settings)
    patched = jsonpatch.apply_patch(pod, patch)
    assert schema_errors(patched) == []
    assert pod_spec_errors(patched["spec"], "patched example-injected") == []
    assert security_baseline_errors(patched["spec"], "patched example-injected") == []

    expected_spec = patched["spec"]
    actual_spec = hand_written["spec"]["template"]["spec"]
    sidecar = expected_spec["initContainers"][0]
    assert sidecar["name"] == SIDECAR_CONTAINER_NAME
    assert sidecar["securityContext"]["runAsUser"] == SIDECAR_UID
    # example-injected asks for a bigger sidecar with an annotation: compare all but the sizes.
    sidecar.pop("resources")
    actual_sidecar = dict(actual_spec["initContainers"][0])
    actual_sidecar.pop("resources")
    assert actual_sidecar == sidecar
    by_name = {v["name"]: v for v in actual_spec["volumes"]}
    for volume in expected_spec["volumes"]:
        assert by_name.get(volume["name"]) == volume
    assert actual_spec["containers"][0]["env"] == expected_spec["containers"][0]["env"]
    assert (
        actual_spec["containers"][0]["volumeMounts"]
        == expected_spec["containers"][0]["volumeMounts"]
    )
    # And the hand-written pod counts as injected: the webhook leaves it alone.
    hand_written_pod = _as_pod(hand_written["spec"]["template"], namespace)
    assert (
        mutate_pod(hand_written_pod, namespace_labels, namespace=namespace, settings=settings) == []
    )


def test_the_example_app_uses_a_native_sidecar_with_a_startup_probe() -> None:
    spec = find(render("example-app"), "Deployment", "example-app")["spec"]["template"]["spec"]
    sidecar = spec["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    app_env = {item["name"]: item for item in spec["containers"][0]["env"]}
    assert app_env["HTTPS_PROXY"]["value"] == "http://127.0.0.1:8080"
    assert "HTTP_PROXY" not in app_env and "http_proxy" not in app_env
    assert app_env["NODE_USE_ENV_PROXY"]["value"] == "1"
    assert not re.search(r"\d+\.\d+\.\d+\.\d+/\d+", app_env["NO_PROXY"]["value"])
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert app_env[name]["value"] == "/var/run/llm-gateway/ca-bundle.pem"
    assert (
        app_env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "example-app-gateway-key"
    )


def test_the_dev_overlay_runs_its_own_datastores() -> None:
    objects = render("overlays/dev")
    for name, port in [("postgres", 5432), ("redis", 6379)]:
        deployment = find(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] == 1
        assert find(objects, "Service", name)["spec"]["ports"][0]["port"] == port
    urls = {
        o["metadata"]["namespace"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
        for o in objects
        if o["kind"] == "Secret" and o["metadata"]["name"] == "llm-gateway-datastores"
    }
    assert set(urls) == {"llm-gateway", "llm-gateway-example"}
    for values in urls.values():
        assert values["DATABASE_URL"].startswith("postgresql://")
        assert "postgres.llm-gateway.svc" in values["DATABASE_URL"]
        assert values["REDIS_URL"].startswith("redis://redis.llm-gateway.svc")
    assert not any(
        o["kind"] == "Deployment" and o["metadata"]["name"] == "postgres"
        for o in render("overlays/cert-manager")
    )


def _may_reach(objects: list[dict[str, Any]], pod_labels: Mapping[str, str],
               port: int) -> list[dict[str, Any]]:
    """The ingress peers (``from`` entries) the NetworkPolicies of the gateway's namespace
    admit to ``port`` of a pod with these labels; [{}] stands for "anyone"."""
    peers: list[dict[str, Any]] = []
    for policy in objects:
        if policy["kind"] != "NetworkPolicy" or not _selects(
            policy["spec"]["podSelector"], pod_labels
        ):
            continue
        for rule in policy["spec"].get("ingress") or []:
            ports = {p.get("port") for p in rule.get("ports") or [{"port": port}]}
            if port in ports:
                peers += rule.get("from") or [{}]
    return peers


@pytest.mark.parametrize("directory", ["base", "overlays/dev"])
def test_the_admin_listener_has_its_own_port_open_only_to_admin_clients(directory: str) -> None:
    """serve's admin API and console (issue 12: ADMIN_BIND_ADDR, never on the public port)
    on a container port and a Service of their own, and only admin-client pods in the
    cluster admitted to it; the public port stays open to the cluster as before."""
    from llm_gateway.config import load_settings

    objects = render(directory)
    deployment = find(objects, "Deployment", "llm-gateway")
    template = deployment["spec"]["template"]
    [container] = template["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    # The file the ConfigMap mounts there is this repository's gateway-config.
    env["LLM_GATEWAY_CONFIG"] = str(K8S / "gateway-config" / "gateway.yaml")
    settings = load_settings({**env, "VENICE_API_KEY": "unused"})
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert settings.admin_bind is not None and settings.admin_bind.host == "0.0.0.0"
    assert ports == {"http": settings.bind.port, "admin": settings.admin_bind.port}
    assert ports["admin"] != ports["http"]

    public = find(objects, "Service", "llm-gateway")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["http"]
    admin = find(objects, "Service", "llm-gateway-admin")
    assert [p["targetPort"] for p in admin["spec"]["ports"]] == ["admin"]
    assert _selects(admin["spec"]["selector"], template["metadata"]["labels"])

    labels = template["metadata"]["labels"]
    namespace = deployment["metadata"]["namespace"]
    in_namespace = [o for o in objects if o["metadata"].get("namespace") == namespace]
    assert _may_reach(in_namespace, labels, ports["http"]) == [{"namespaceSelector": {}}]
    admitted = _may_reach(in_namespace, labels, ports["admin"])
    assert admitted == [{"namespaceSelector": {},
                         "podSelector": {"matchLabels": {"llm-gateway.io/admin-client": "true"}}}]
    # Anything else is denied: a default-deny policy selects every pod of the namespace.
    assert any(o["kind"] == "NetworkPolicy" and o["spec"]["podSelector"] == {}
               and o["spec"]["policyTypes"] == ["Ingress"] and not o["spec"].get("ingress")
               for o in in_namespace)


def test_the_gateway_yaml_loads_with_no_unknown_settings() -> None:
    from llm_gateway.config import load_settings

    settings = load_settings({}, str(K8S / "gateway-config" / "gateway.yaml"))
    assert "api.openai.com" in settings.llm_host_roots()


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_every_gateway_keeps_its_usage_spool_on_a_writable_volume(directory: str) -> None:
    """serve and every sidecar run on a read-only root file system: USAGE_SPOOL_DIR must
    name a mounted emptyDir (the default under /var/lib/llm-gateway cannot be created
    there, and the gateway refuses to start without a spool it can write)."""
    for workload in render(directory):
        if workload["kind"] not in WORKLOAD_KINDS:
            continue
        spec = pod_template(workload)["spec"]
        volumes = {volume["name"]: volume for volume in spec.get("volumes") or []}
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            if (container.get("args") or [None])[0] not in ("serve", "sidecar"):
                continue
            where = f"k8s/{directory}: {workload['metadata']['name']}/{container['name']}"
            env = {item["name"]: item.get("value") for item in container.get("env") or []}
            assert env.get("USAGE_SPOOL_DIR"), f"{where}: no USAGE_SPOOL_DIR"
            [mount] = [m for m in container.get("volumeMounts") or []
                       if m["mountPath"] == env["USAGE_SPOOL_DIR"]]
            assert not mount.get("readOnly"), where
            assert "emptyDir" in volumes[mount["name"]], where


def test_the_reconcile_cronjob_runs_the_command_daily_with_the_admin_key_alone() -> None:
    objects = render("base")
    job = find(objects, "CronJob", "llm-gateway-reconcile")
    assert job["spec"]["concurrencyPolicy"] == "Forbid" and job["spec"]["timeZone"] == "Etc/UTC"
    template = pod_template(job)
    [container] = template["spec"]["containers"]
    assert container["args"][:3] == ["reconcile", "--provider", "venice"]
    assert container["image"].startswith(f"{IMAGE_NAME}:")
    # A drift (exit 1) fails the Job at once; the bill would read the same on a retry.
    [fail, _] = job["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [1]
    sources = {source["secretRef"]["name"] for source in container["envFrom"]}
    assert "llm-gateway-provider-admin" in sources
    # No other workload gets the admin keys.
    for obj, other in pod_templates(objects):
        if obj is job:
            continue
        for each in [*(other["spec"].get("initContainers") or []),
                     *other["spec"]["containers"]]:
            assert "llm-gateway-provider-admin" not in str(each.get("envFrom")), _name(obj)
    # The flags it passes are the command's.
    parser = build_parser()
    parsed = parser.parse_args(container["args"])
    assert (parsed.provider, parsed.tolerance) == ("venice", "0.5%")
