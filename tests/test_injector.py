"""The sidecar injector: real AdmissionReview v1 requests in, JSONPatches that apply and validate.

Each review is shaped the way the API server sends it to a mutating webhook: the pod already
carries the defaults and the ServiceAccount token volume the built-in admission plugins add.
The returned patch is applied with a real RFC 6902 implementation (``jsonpatch``), the patched
pod is validated against the Kubernetes 1.29 Pod schema, and it is then reviewed again, which
must patch nothing.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llm_gateway.k8s import (
    CA_BUNDLE_FILE,
    SIDECAR_CONTAINER_NAME,
    InjectionRefused,
    InjectorSettings,
    ReloadingCertificate,
    create_injector_app,
    mutate_pod,
)
from tests.test_k8s_manifests import pod_spec_errors, schema_errors, security_baseline_errors

SETTINGS = InjectorSettings(sidecar_image="registry.example.com/llm-gateway:1.2.3")
NAMESPACE_PATH = "/mutate"  # the namespace-selected webhook entry
ANNOTATION_PATH = "/mutate/annotated"  # the pod-annotation webhook entry
APP_ENV = {
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_USE_ENV_PROXY",
}


# --- AdmissionReviews as the API server sends them -------------------------------------------


def _container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access-7xk2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        **extra,
    }


def make_pod(
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod from a ReplicaSet, after the API server's defaulting and ServiceAccount plugin."""
    metadata: dict[str, Any] = {
        "generateName": "web-5d8f7c9b6-",
        "namespace": "team-a",
        "creationTimestamp": None,
        "labels": {"app": "web", "pod-template-hash": "5d8f7c9b6", **(labels or {})},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-5d8f7c9b6",
                "uid": "0c9f3d4e-1b2a-4c5d-8e7f-6a5b4c3d2e1f",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2025-01-01T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}}},
            }
        ],
    }
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-7xk2p",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": containers or [_container("web", "ghcr.io/example/web:1.0")],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            **spec,
        },
        "status": {},
    }


def make_review(pod: dict[str, Any], namespace: str = "team-a", **request: Any) -> dict[str, Any]:
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "5b1c4f0a-2d3e-4f5a-9b8c-7d6e5f4a3b2c",
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:kube-system",
                    "system:authenticated",
                ],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            **request,
        },
    }


# --- running reviews through the ASGI app ----------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_injector_app(SETTINGS))
    async with httpx.AsyncClient(transport=transport, base_url="http://injector") as client:
        yield client


async def review(
    client: httpx.AsyncClient, pod: dict[str, Any], path: str = NAMESPACE_PATH, **request: Any
) -> dict[str, Any]:
    sent = make_review(pod, **request)
    answer = await client.post(path, json=sent)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == sent["request"]["uid"]
    return body["response"]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] is True
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def assert_valid_pod(pod: dict[str, Any]) -> None:
    errors = schema_errors(pod) + pod_spec_errors(pod["spec"], "patched pod")
    assert not errors, "\n".join(errors)


async def inject(
    client: httpx.AsyncClient, pod: dict[str, Any], path: str = NAMESPACE_PATH, **request: Any
) -> dict[str, Any]:
    """Review, apply the patch, validate the result, and check that a second pass is a no-op."""
    assert_valid_pod(pod)
    patch = patch_of(await review(client, pod, path, **request))
    assert patch, "expected the sidecar to be injected"
    patched = jsonpatch.apply_patch(pod, patch)
    assert_valid_pod(patched)
    assert patch_of(await review(client, patched, path, **request)) == []
    # Applying the same patch to the untouched pod gives the same pod (it is data, not state).
    assert jsonpatch.apply_patch(copy.deepcopy(pod), patch) == patched
    return patched


def sidecar_of(pod: dict[str, Any]) -> dict[str, Any]:
    sidecar = pod["spec"]["initContainers"][0]
    assert sidecar["name"] == SIDECAR_CONTAINER_NAME
    return sidecar


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env") or []}


# --- opting in and out -----------------------------------------------------------------------


async def test_namespace_opt_in_injects_the_sidecar(client: httpx.AsyncClient) -> None:
    patched = await inject(client, make_pod())
    spec = patched["spec"]
    sidecar = sidecar_of(patched)
    assert sidecar["image"] == SETTINGS.sidecar_image
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": 9090}
    assert sidecar["args"][:2] == ["sidecar", "--listen"]
    assert security_baseline_errors({"initContainers": [sidecar], "containers": []}, "pod") == []
    app_env = env_of(spec["containers"][0])
    assert set(app_env) >= APP_ENV
    assert app_env["HTTPS_PROXY"]["value"] == "http://127.0.0.1:8080"
    assert "HTTP_PROXY" not in app_env
    assert app_env["SSL_CERT_FILE"]["value"] == CA_BUNDLE_FILE
    assert app_env["NODE_USE_ENV_PROXY"]["value"] == "1"
    assert "OPENAI_API_KEY" not in app_env and "ANTHROPIC_API_KEY" not in app_env
    bundle_mount = spec["containers"][0]["volumeMounts"][-1]
    assert bundle_mount == {
        "name": "llm-gateway-ca-bundle",
        "mountPath": "/var/run/llm-gateway",
        "readOnly": True,
    }
    # The existing token volume and mount are untouched, and the pod is marked.
    assert spec["volumes"][0]["name"] == "kube-api-access-7xk2p"
    assert spec["containers"][0]["volumeMounts"][0]["name"] == "kube-api-access-7xk2p"
    assert patched["metadata"]["annotations"] == {"llm-gateway.io/status": "injected"}
    # The per-pod CA is writable (the sidecar makes it); no Secret is needed for it.
    ca_volume = next(v for v in spec["volumes"] if v["name"] == "llm-gateway-ca")
    assert "emptyDir" in ca_volume
    # So is the usage spool, on the read-only root file system: an emptyDir of its own.
    spool_dir = env_of(sidecar)["USAGE_SPOOL_DIR"]["value"]
    assert {"name": "llm-gateway-spool", "mountPath": spool_dir} in sidecar["volumeMounts"]
    spool_volume = next(v for v in spec["volumes"] if v["name"] == "llm-gateway-spool")
    assert "emptyDir" in spool_volume


async def test_annotation_opt_in_injects_outside_opted_in_namespaces(
    client: httpx.AsyncClient,
) -> None:
    pod = make_pod(annotations={"llm-gateway.io/inject": "true"})
    patched = await inject(client, pod, ANNOTATION_PATH)
    assert patched["metadata"]["annotations"] == {
        "llm-gateway.io/inject": "true",
        "llm-gateway.io/status": "injected",
    }
    labelled = make_pod(labels={"llm-gateway.io/inject": "true"})
    await inject(client, labelled, ANNOTATION_PATH)


async def test_pods_that_did_not_opt_in_are_left_alone(client: httpx.AsyncClient) -> None:
    for pod in [
        make_pod(),
        make_pod(annotations={"team": "a"}),
        make_pod(annotations={"llm-gateway.io/inject": "yes please"}),
    ]:
        response = await review(client, pod, ANNOTATION_PATH)
        assert patch_of(response) == []
    response = await review(client, make_pod(annotations={"llm-gateway.io/inject": "maybe"}))
    assert patch_of(response)  # the namespace opted in; the odd value is only warned about
    assert any("maybe" in warning for warning in response["warnings"])


@pytest.mark.parametrize(
    "metadata",
    [
        {"annotations": {"llm-gateway.io/inject": "false"}},
        {"annotations": {"llm-gateway.io/inject": "False"}},
        {"labels": {"llm-gateway.io/inject": "false"}},
        # The annotation wins over the label.
        {
            "annotations": {"llm-gateway.io/inject": "false"},
            "labels": {"llm-gateway.io/inject": "true"},
        },
    ],
)
async def test_opt_out_wins_over_the_namespace(client: httpx.AsyncClient, metadata: dict) -> None:
    pod = make_pod(**metadata)
    assert patch_of(await review(client, pod)) == []
    assert patch_of(await review(client, pod, ANNOTATION_PATH)) == []


@pytest.mark.parametrize("namespace", ["llm-gateway", "kube-system"])
async def test_never_injects_into_its_own_or_system_namespaces(
    client: httpx.AsyncClient, namespace: str
) -> None:
    pod = make_pod(annotations={"llm-gateway.io/inject": "true"})
    pod["metadata"]["namespace"] = namespace
    for path in (NAMESPACE_PATH, ANNOTATION_PATH):
        assert patch_of(await review(client, pod, path, namespace=namespace)) == []


async def test_own_namespace_comes_from_the_environment() -> None:
    settings = InjectorSettings.from_env({"POD_NAMESPACE": "gateway-system"})
    pod = make_pod(annotations={"llm-gateway.io/inject": "true"})
    assert mutate_pod(pod, {}, namespace="gateway-system", settings=settings) == []
    assert mutate_pod(pod, {}, namespace="llm-gateway", settings=settings)


async def test_already_injected_pods_are_left_alone(client: httpx.AsyncClient) -> None:
    marked = make_pod(annotations={"llm-gateway.io/status": "injected"})
    assert patch_of(await review(client, marked)) == []
    # Declared by hand (as in the example Deployment), even without the annotation.
    by_hand = make_pod(
        initContainers=[
            _container(SIDECAR_CONTAINER_NAME, "llm-gateway:0.1.0", restartPolicy="Always")
        ]
    )
    assert patch_of(await review(client, by_hand)) == []


# --- pods with more in them ------------------------------------------------------------------


async def test_several_containers_with_existing_env_volumes_and_init_containers(
    client: httpx.AsyncClient,
) -> None:
    pod = make_pod(
        annotations={
            "llm-gateway.io/gateway-key-secret": "web-gateway-key",
            "llm-gateway.io/gateway-key-secret-key": "token",
        },
        containers=[
            _container(
                "web",
                "ghcr.io/example/web:1.0",
                env=[
                    {"name": "LOG_LEVEL", "value": "debug"},
                    # The app's own proxy setting wins; the webhook only warns.
                    {"name": "HTTPS_PROXY", "value": "http://corporate-proxy:3128"},
                ],
                ports=[{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            ),
            _container(
                "worker",
                "ghcr.io/example/worker:1.0",
                envFrom=[{"configMapRef": {"name": "worker-config"}}],
            ),
            _container("log-shipper", "fluent/fluent-bit:3.0"),
        ],
        initContainers=[_container("migrate", "ghcr.io/example/web:1.0", args=["migrate"])],
    )
    pod["spec"]["volumes"].append({"name": "cache", "emptyDir": {}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "cache", "mountPath": "/cache"})
    response = await review(client, pod)
    assert any("HTTPS_PROXY" in warning for warning in response["warnings"])
    assert any("8080" in warning for warning in response["warnings"])
    patched = await inject(client, pod)
    spec = patched["spec"]

    # The sidecar goes first, so the app's own init container already has the CA bundle.
    assert [c["name"] for c in spec["initContainers"]] == [SIDECAR_CONTAINER_NAME, "migrate"]
    assert spec["initContainers"][1] == pod["spec"]["initContainers"][0]
    assert [c["name"] for c in spec["containers"]] == ["web", "worker", "log-shipper"]
    assert [v["name"] for v in spec["volumes"]] == [
        "kube-api-access-7xk2p",
        "cache",
        "llm-gateway-ca",
        "llm-gateway-ca-bundle",
        "llm-gateway-tmp",
        "llm-gateway-spool",
        "llm-gateway-config",
    ]
    web, worker, shipper = (env_of(c) for c in spec["containers"])
    assert web["LOG_LEVEL"]["value"] == "debug"
    assert web["HTTPS_PROXY"]["value"] == "http://corporate-proxy:3128"
    assert [item["name"] for item in spec["containers"][0]["env"]].count("HTTPS_PROXY") == 1
    for env in (web, worker, shipper):
        assert set(env) >= APP_ENV
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):  # either SDK finds it
            assert env[name] == {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": "web-gateway-key", "key": "token"}},
            }
    assert spec["containers"][1]["envFrom"] == [{"configMapRef": {"name": "worker-config"}}]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == [
        "kube-api-access-7xk2p",
        "cache",
        "llm-gateway-ca-bundle",
    ]
    # Nobody but the sidecar gets the provider key (nor the metrics token, if there is one).
    assert sidecar_of(patched)["envFrom"] == [
        {"secretRef": {"name": "llm-gateway-provider"}},
        {"secretRef": {"name": "llm-gateway-datastores"}},
        {"secretRef": {"name": "llm-gateway-metrics", "optional": True}},
    ]
    for container in spec["containers"]:
        assert "envFrom" not in container or all(
            "secretRef" not in source for source in container["envFrom"]
        )


async def test_a_pod_without_annotations_volumes_or_env(client: httpx.AsyncClient) -> None:
    pod = make_pod(containers=[{"name": "bare", "image": "busybox:1.36"}])
    del pod["spec"]["volumes"]
    patched = await inject(client, pod)
    assert patched["spec"]["containers"][0]["env"][0]["name"] == "HTTPS_PROXY"
    assert "annotations" not in pod["metadata"]


async def test_annotations_size_and_place_the_sidecar(client: httpx.AsyncClient) -> None:
    pod = make_pod(
        annotations={
            "llm-gateway.io/sidecar-cpu-request": "100m",
            "llm-gateway.io/sidecar-memory-request": "200Mi",
            "llm-gateway.io/sidecar-cpu-limit": "1",
            "llm-gateway.io/sidecar-memory-limit": "1Gi",
            "llm-gateway.io/proxy-port": "15001",
            "llm-gateway.io/admin-port": "15021",
            "llm-gateway.io/no-proxy": "internal.example.com,.corp",
            "llm-gateway.io/ca-secret": "team-a-llm-ca",
        }
    )
    patched = await inject(client, pod)
    sidecar = sidecar_of(patched)
    assert sidecar["resources"] == {
        "requests": {"cpu": "100m", "memory": "200Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert "127.0.0.1:15001" in sidecar["args"] and "0.0.0.0:15021" in sidecar["args"]
    # The pod IP's port is the probe port (health and metrics only); no admin API in the pod.
    args = sidecar["args"]
    assert args[args.index("--probe") + 1] == "0.0.0.0:15021"
    assert args[args.index("--admin") + 1] == "off"
    assert sidecar["livenessProbe"]["httpGet"]["port"] == 15021
    env = env_of(patched["spec"]["containers"][0])
    assert env["HTTPS_PROXY"]["value"] == "http://127.0.0.1:15001"
    assert env["NO_PROXY"]["value"].endswith(",internal.example.com,.corp")
    ca_volume = next(v for v in patched["spec"]["volumes"] if v["name"] == "llm-gateway-ca")
    assert ca_volume == {
        "name": "llm-gateway-ca",
        "secret": {"secretName": "team-a-llm-ca", "defaultMode": 0o444},
    }
    ca_mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "llm-gateway-ca")
    assert ca_mount["readOnly"] is True


@pytest.mark.parametrize(
    ("annotations", "complaint"),
    [
        ({"llm-gateway.io/sidecar-memory-limit": "lots"}, "sidecar-memory-limit"),
        (
            {"llm-gateway.io/sidecar-cpu-request": "2", "llm-gateway.io/sidecar-cpu-limit": "500m"},
            "exceeds",
        ),
        ({"llm-gateway.io/proxy-port": "70000"}, "proxy-port"),
        ({"llm-gateway.io/admin-port": "8080"}, "both 8080"),
        ({"llm-gateway.io/gateway-key-secret": "Not_A_Name"}, "gateway-key-secret"),
        ({"llm-gateway.io/gateway-key-secret-key": "token"}, "gateway-key-secret"),
        ({"llm-gateway.io/ca-secret": "-bad"}, "ca-secret"),
    ],
)
async def test_bad_annotations_deny_the_pod_with_a_reason(
    client: httpx.AsyncClient, annotations: dict[str, str], complaint: str
) -> None:
    # Denied rather than started without the proxy, where the app would fail obscurely.
    response = await review(client, make_pod(annotations=annotations))
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 400
    assert complaint in response["status"]["message"]
    with pytest.raises(InjectionRefused):
        mutate_pod(
            make_pod(annotations=annotations),
            {"llm-gateway.io/inject": "enabled"},
            namespace="team-a",
        )


async def test_host_network_pods_are_not_injected(client: httpx.AsyncClient) -> None:
    response = await review(client, make_pod(hostNetwork=True))
    assert patch_of(response) == []
    assert any("hostNetwork" in warning for warning in response["warnings"])


async def test_clashing_volume_names_deny_the_pod(client: httpx.AsyncClient) -> None:
    pod = make_pod()
    pod["spec"]["volumes"].append({"name": "llm-gateway-ca-bundle", "emptyDir": {}})
    response = await review(client, pod)
    assert response["allowed"] is False


def test_mutate_pod_is_a_pure_function() -> None:
    pod = make_pod()
    before = copy.deepcopy(pod)
    first = mutate_pod(
        pod, {"llm-gateway.io/inject": "enabled"}, namespace="team-a", settings=SETTINGS
    )
    second = mutate_pod(
        pod, {"llm-gateway.io/inject": "enabled"}, namespace="team-a", settings=SETTINGS
    )
    assert pod == before
    assert first == second
    assert mutate_pod(pod, {}, namespace="team-a", settings=SETTINGS) == []


def test_settings_come_from_the_environment() -> None:
    settings = InjectorSettings.from_env(
        {
            "LLM_GATEWAY_SIDECAR_IMAGE": "r.example.com/llm-gateway:2.0.0",
            "LLM_GATEWAY_CA_SECRET": "llm-gateway-sidecar-ca",
            "LLM_GATEWAY_CONFIG_MAP": "",
            "LLM_GATEWAY_SIDECAR_MEMORY_LIMIT": "512Mi",
        }
    )
    assert settings.sidecar_image == "r.example.com/llm-gateway:2.0.0"
    assert settings.sidecar_resources["limits"]["memory"] == "512Mi"
    pod = make_pod()
    patched = jsonpatch.apply_patch(
        pod, mutate_pod(pod, {"llm-gateway.io/inject": "enabled"}, namespace="a", settings=settings)
    )
    assert_valid_pod(patched)
    assert "llm-gateway-config" not in {v["name"] for v in patched["spec"]["volumes"]}
    assert "LLM_GATEWAY_CONFIG" not in env_of(sidecar_of(patched))
    with pytest.raises(ValueError, match="LLM_GATEWAY_SIDECAR_CPU_LIMIT"):
        InjectorSettings.from_env({"LLM_GATEWAY_SIDECAR_CPU_LIMIT": "fast"})
    with pytest.raises(ValueError, match="differ"):
        InjectorSettings.from_env({"LLM_GATEWAY_SIDECAR_ADMIN_PORT": "8080"})


# --- what is not a pod creation, and what is not a review ------------------------------------


async def test_other_operations_and_kinds_pass_untouched(client: httpx.AsyncClient) -> None:
    pod = make_pod()
    assert patch_of(await review(client, pod, operation="UPDATE", oldObject=pod)) == []
    assert patch_of(await review(client, pod, subResource="ephemeralcontainers")) == []
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}, "spec": {}}
    response = await review(
        client, deployment, kind={"group": "apps", "version": "v1", "kind": "Deployment"}
    )
    assert patch_of(response) == []


async def test_dry_run_reviews_are_answered_the_same(client: httpx.AsyncClient) -> None:
    response = await review(client, make_pod(), dryRun=True)
    assert patch_of(response)


async def test_http_surface(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/mutate")).status_code == 405
    assert (await client.post("/elsewhere", json={})).status_code == 404
    assert (await client.post("/mutate", content=b"{not json")).status_code == 400
    old = make_review(make_pod())
    old["apiVersion"] = "admission.k8s.io/v1beta1"
    assert (await client.post("/mutate", json=old)).status_code == 400
    no_uid = make_review(make_pod())
    del no_uid["request"]["uid"]
    assert (await client.post("/mutate", json=no_uid)).status_code == 400
    huge = b'{"pad": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    assert (await client.post("/mutate", content=huge)).status_code == 413


# --- the command line, TLS and certificate renewal -------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_certificate(directory: Path, common_name: str) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 / localhost; returns (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = (
        directory / "ca.crt",
        directory / "tls.crt",
        directory / "tls.key",
    )
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, cert_file, key_file


def _injector_command() -> list[str]:
    script = Path(sys.executable).parent / "llm-gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "llm_gateway.cli"]


@contextmanager
def running_injector(args: list[str], url: str, verify: Any) -> Iterator[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "LLM_GATEWAY_SIDECAR_IMAGE": "llm-gateway:9.9.9",
        "POD_NAMESPACE": "llm-gateway",
    }
    process = subprocess.Popen(
        [*_injector_command(), "injector", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"injector exited with {process.returncode}: {process.stderr.read()}")
            try:
                if httpx.get(f"{url}/healthz", verify=verify, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the injector did not become healthy within 15 s")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_injector_command_serves_https(tmp_path: Path) -> None:
    ca_file, cert_file, key_file = _write_certificate(tmp_path / "tls", "injector")
    port = _free_port()
    url = f"https://127.0.0.1:{port}"
    args = [
        "--listen",
        f"127.0.0.1:{port}",
        "--tls-cert",
        str(cert_file),
        "--tls-key",
        str(key_file),
    ]
    trust = ssl.create_default_context(cafile=str(ca_file))
    with running_injector(args, url, verify=trust) as process:
        sent = make_review(make_pod())
        answer = httpx.post(f"{url}/mutate", json=sent, verify=trust, timeout=5).json()
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        patched = jsonpatch.apply_patch(make_pod(), patch)
        assert sidecar_of(patched)["image"] == "llm-gateway:9.9.9"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert "plain HTTP" not in stderr


def test_the_injector_command_warns_when_serving_plain_http() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with running_injector(["--listen", f"127.0.0.1:{port}"], url, verify=False) as process:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert "WARNING" in stderr and "plain HTTP" in stderr and "local tests" in stderr


def test_the_injector_command_rejects_half_a_key_pair(tmp_path: Path) -> None:
    result = subprocess.run(
        [*_injector_command(), "injector", "--tls-cert", str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--tls-cert and --tls-key go together" in result.stderr


def _served_common_name(port: int, ca_file: Path) -> str:
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        subject = dict(item[0] for item in tls.getpeercert()["subject"])
        return subject["commonName"]


def test_renewed_certificates_are_served_without_a_restart(tmp_path: Path) -> None:
    # cert-manager renews the Secret in place; the webhook must not keep serving the old one.
    ca_file, cert_file, key_file = _write_certificate(tmp_path / "live", "first")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_file, key_file)
    certificate = ReloadingCertificate(str(cert_file), str(key_file), check_interval_seconds=0)
    certificate.install(server_context)

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                with server_context.wrap_socket(connection, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert _served_common_name(port, ca_file) == "first"
        renewed_ca, renewed_cert, renewed_key = _write_certificate(tmp_path / "renewed", "second")
        os.replace(renewed_key, key_file)
        os.replace(renewed_cert, cert_file)
        # Make the change visible even on file systems with coarse timestamps.
        later = time.time() + 5
        os.utime(cert_file, (later, later))
        os.utime(key_file, (later, later))
        assert _served_common_name(port, renewed_ca) == "second"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)
