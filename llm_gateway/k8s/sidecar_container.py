"""The sidecar container the injector adds to a pod: its arguments, environment, secrets,
probes, mounts and security context, from the injector's settings for that pod. No I/O.

The pod-facing port (``admin_port``: ``llm-gateway.io/admin-port``, 9090 by default) is the
sidecar's probe port: the kubelet's probes and Prometheus reach it on the pod IP, and it
answers ``/healthz``, ``/readyz`` and ``/metrics`` (with ``METRICS_TOKEN``) and nothing else.
The admin API is off in app pods: ``serve``'s admin port is the admin plane.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.k8s.settings import (
    CA_BUNDLE_DIR,
    CA_BUNDLE_FILE,
    CA_BUNDLE_VOLUME,
    CA_DIR,
    CA_VOLUME,
    CONFIG_DIR,
    CONFIG_FILE_KEY,
    CONFIG_VOLUME,
    SIDECAR_CONTAINER_NAME,
    SIDECAR_UID,
    SPOOL_DIR,
    SPOOL_VOLUME,
    TMP_VOLUME,
    InjectorSettings,
    copy_resources,
)


def sidecar_container(settings: InjectorSettings) -> dict[str, Any]:
    return {
        "name": SIDECAR_CONTAINER_NAME,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.image_pull_policy,
        "restartPolicy": "Always",
        "args": [
            "sidecar",
            "--listen",
            f"127.0.0.1:{settings.proxy_port}",
            # The kubelet's probes and Prometheus come to the pod IP: that port answers
            # /healthz, /readyz and /metrics (with METRICS_TOKEN) and nothing else. An app
            # pod has no use for the admin API (serve's admin port is the admin plane).
            "--probe",
            f"0.0.0.0:{settings.admin_port}",
            "--admin",
            "off",
            "--ca-dir",
            CA_DIR,
            "--ca-bundle-out",
            CA_BUNDLE_FILE,
        ],
        "env": _sidecar_env(settings),
        "envFrom": _sidecar_env_from(settings),
        **_sidecar_probes(settings.admin_port),
        "resources": copy_resources(settings.sidecar_resources),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": _sidecar_mounts(settings),
    }


def _sidecar_env_from(settings: InjectorSettings) -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = [
        {"secretRef": {"name": settings.provider_secret}},
        {"secretRef": {"name": settings.datastore_secret}},
    ]
    if settings.metrics_secret:
        # METRICS_TOKEN, which /metrics on the pod IP asks Prometheus for; optional: without
        # it the probe port refuses /metrics (its labels name keys) and serves the probes.
        sources.append({"secretRef": {"name": settings.metrics_secret, "optional": True}})
    return sources


def _sidecar_env(settings: InjectorSettings) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "OTEL_SERVICE_NAME", "value": SIDECAR_CONTAINER_NAME},
        {
            "name": "OTEL_RESOURCE_ATTRIBUTES",
            "value": "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)",
        },
        # The root file system is read-only; libraries that write under $HOME get /tmp.
        {"name": "HOME", "value": "/tmp"},
        {"name": "USAGE_SPOOL_DIR", "value": SPOOL_DIR},
    ]
    if settings.config_map:
        env.append({"name": "LLM_GATEWAY_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE_KEY}"})
    return env


def _sidecar_mounts(settings: InjectorSettings) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": bool(settings.ca_secret)},
        {"name": CA_BUNDLE_VOLUME, "mountPath": CA_BUNDLE_DIR},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR},
    ]
    if settings.config_map:
        mounts.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    return mounts


def _sidecar_probes(admin_port: int) -> dict[str, Any]:
    admin_probe = {"path": "/readyz", "port": admin_port}
    return {
        # /readyz answers only once the CA bundle exists: until then no other container starts.
        "startupProbe": {
            "httpGet": admin_probe,
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 120,
        },
        "readinessProbe": {"httpGet": admin_probe, "periodSeconds": 10, "timeoutSeconds": 2},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": admin_port},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
    }
