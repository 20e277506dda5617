"""Mutating admission webhook that injects the llm-gateway sidecar into pods.

Selection is split the way service meshes split it, because an AdmissionReview carries the
pod's namespace *name* but not the namespace's labels:

* The MutatingWebhookConfiguration does the label matching. Its entry for namespaces labelled
  ``llm-gateway.io/inject=enabled`` calls ``POST /mutate``; its entry for pods annotated
  ``llm-gateway.io/inject: "true"`` in any other namespace calls ``POST /mutate/annotated``
  (a CEL matchCondition keeps the API server from calling it for every other pod).
* The webhook re-checks what it can see itself: the opt-out annotation, its own namespace, the
  system namespaces, pods that already carry the sidecar, and (on ``/mutate/annotated``) the
  opt-in annotation, so a misconfigured selector cannot inject into pods nobody opted in.

The patch is an RFC 6902 JSONPatch: the sidecar becomes the first init container with
``restartPolicy: Always`` (a native sidecar, so it is ready before any other container starts
and exits on its own when a Job's containers finish), and every app container gets the proxy
and CA-bundle variables plus a read-only mount of the bundle.
"""

from __future__ import annotations

import argparse
import base64
import importlib.metadata
import json
import logging
import os
import re
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from llm_gateway.asgi_types import answer_lifespan

logger = logging.getLogger("llm_gateway.injector")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANNOTATION_PREFIX = "llm-gateway.io/"
INJECT_KEY = "llm-gateway.io/inject"
NAMESPACE_OPT_IN_VALUE = "enabled"
STATUS_ANNOTATION = "llm-gateway.io/status"
STATUS_INJECTED = "injected"
GATEWAY_KEY_SECRET_ANNOTATION = "llm-gateway.io/gateway-key-secret"
GATEWAY_KEY_SECRET_KEY_ANNOTATION = "llm-gateway.io/gateway-key-secret-key"
CA_SECRET_ANNOTATION = "llm-gateway.io/ca-secret"
NO_PROXY_ANNOTATION = "llm-gateway.io/no-proxy"
PROXY_PORT_ANNOTATION = "llm-gateway.io/proxy-port"
ADMIN_PORT_ANNOTATION = "llm-gateway.io/admin-port"
RESOURCE_ANNOTATIONS: dict[str, tuple[str, str]] = {
    "llm-gateway.io/sidecar-cpu-request": ("requests", "cpu"),
    "llm-gateway.io/sidecar-memory-request": ("requests", "memory"),
    "llm-gateway.io/sidecar-cpu-limit": ("limits", "cpu"),
    "llm-gateway.io/sidecar-memory-limit": ("limits", "memory"),
}

SIDECAR_CONTAINER_NAME = "llm-gateway-sidecar"
CA_VOLUME = "llm-gateway-ca"
CA_BUNDLE_VOLUME = "llm-gateway-ca-bundle"
TMP_VOLUME = "llm-gateway-tmp"
CONFIG_VOLUME = "llm-gateway-config"
CA_DIR = "/etc/llm-gateway/ca"
CA_BUNDLE_DIR = "/var/run/llm-gateway"
CA_BUNDLE_FILE = f"{CA_BUNDLE_DIR}/ca-bundle.pem"
CONFIG_DIR = "/etc/llm-gateway/config"
CONFIG_FILE_KEY = "gateway.yaml"
DEFAULT_GATEWAY_KEY_SECRET_KEY = "api-key"
# The image's non-root user (sidecar/Dockerfile). runAsNonRoot can only be verified by the
# kubelet against a numeric user, so it is spelled out rather than left to the image.
SIDECAR_UID = 10001
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# Names, not CIDRs: httpx (and with it the OpenAI Python SDK) ignores CIDR ranges in NO_PROXY.
DEFAULT_NO_PROXY = (
    "localhost,127.0.0.1,::1,.svc,.svc.cluster.local,.cluster.local,"
    "kubernetes.default,kubernetes.default.svc"
)
MAX_REVIEW_BYTES = 8 * 1024 * 1024

# https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?$"
)
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_EXPONENTS |= {"P": 15, "E": 18}
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass(frozen=True)
class InjectorSettings:
    """What the injector puts into pods; every field can be set from the environment."""

    sidecar_image: str = field(default_factory=lambda: _default_sidecar_image())
    image_pull_policy: str = "IfNotPresent"
    own_namespace: str = "llm-gateway"
    provider_secret: str = "llm-gateway-provider"
    datastore_secret: str = "llm-gateway-datastores"
    # Empty: no gateway YAML is mounted and the sidecar runs on environment settings alone.
    config_map: str = "llm-gateway-config"
    # Empty: every pod gets a fresh CA in an emptyDir; otherwise the named Secret (for example
    # one that cert-manager keeps) is mounted read-only as the CA directory.
    ca_secret: str = ""
    proxy_port: int = 8080
    admin_port: int = 9090
    no_proxy: str = DEFAULT_NO_PROXY
    sidecar_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        }
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InjectorSettings:
        env = os.environ if environ is None else environ
        defaults = cls()
        resources = {kind: dict(values) for kind, values in defaults.sidecar_resources.items()}
        for variable, (kind, resource) in {
            "LLM_GATEWAY_SIDECAR_CPU_REQUEST": ("requests", "cpu"),
            "LLM_GATEWAY_SIDECAR_MEMORY_REQUEST": ("requests", "memory"),
            "LLM_GATEWAY_SIDECAR_CPU_LIMIT": ("limits", "cpu"),
            "LLM_GATEWAY_SIDECAR_MEMORY_LIMIT": ("limits", "memory"),
        }.items():
            if env.get(variable):
                resources[kind][resource] = _checked_quantity(variable, env[variable])
        settings = replace(
            defaults,
            sidecar_image=env.get("LLM_GATEWAY_SIDECAR_IMAGE", defaults.sidecar_image),
            image_pull_policy=env.get(
                "LLM_GATEWAY_SIDECAR_IMAGE_PULL_POLICY", defaults.image_pull_policy
            ),
            # POD_NAMESPACE comes from the downward API in the injector's Deployment.
            own_namespace=env.get("POD_NAMESPACE", defaults.own_namespace),
            provider_secret=env.get("LLM_GATEWAY_PROVIDER_SECRET", defaults.provider_secret),
            datastore_secret=env.get("LLM_GATEWAY_DATASTORE_SECRET", defaults.datastore_secret),
            config_map=env.get("LLM_GATEWAY_CONFIG_MAP", defaults.config_map),
            ca_secret=env.get("LLM_GATEWAY_CA_SECRET", defaults.ca_secret),
            proxy_port=_checked_port(
                "LLM_GATEWAY_SIDECAR_PROXY_PORT",
                env.get("LLM_GATEWAY_SIDECAR_PROXY_PORT", str(defaults.proxy_port)),
            ),
            admin_port=_checked_port(
                "LLM_GATEWAY_SIDECAR_ADMIN_PORT",
                env.get("LLM_GATEWAY_SIDECAR_ADMIN_PORT", str(defaults.admin_port)),
            ),
            no_proxy=env.get("LLM_GATEWAY_NO_PROXY", defaults.no_proxy),
            sidecar_resources=resources,
        )
        if settings.proxy_port == settings.admin_port:
            raise ValueError("the sidecar's proxy and admin ports must differ")
        return settings


def _default_sidecar_image() -> str:
    # The image built from this very version; deployments set LLM_GATEWAY_SIDECAR_IMAGE.
    try:
        return f"llm-gateway:{importlib.metadata.version('llm-gateway')}"
    except importlib.metadata.PackageNotFoundError:
        return "llm-gateway:latest"


class InjectionRefused(ValueError):
    """The pod asked for injection in a way that cannot be honoured (e.g. a bad annotation).

    The webhook denies such a pod with this message rather than let it start without the
    proxy, where its requests would reach the provider with a gateway key and fail obscurely.
    """


@dataclass
class InjectionResult:
    """A decision: the patch (empty: leave the pod alone), why, and what to warn about."""

    patch: list[dict[str, Any]]
    reason: str
    warnings: list[str] = field(default_factory=list)


def mutate_pod(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    *,
    namespace: str,
    settings: InjectorSettings | None = None,
) -> list[dict[str, Any]]:
    """Return the JSONPatch that injects the sidecar into ``pod``; empty when nothing is to do.

    ``namespace_labels`` are the labels of the pod's namespace as far as the caller knows them
    (the webhook knows only that its namespace-selected entry matched). Raises
    :class:`InjectionRefused` for a pod that opted in with an annotation it cannot honour.
    """
    return plan_injection(pod, namespace_labels, namespace=namespace, settings=settings).patch


def plan_injection(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    *,
    namespace: str,
    settings: InjectorSettings | None = None,
) -> InjectionResult:
    """:func:`mutate_pod` with the reason for its decision and warnings for the requester."""
    settings = settings or InjectorSettings()
    metadata = pod.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    warnings: list[str] = []

    if namespace == settings.own_namespace:
        return InjectionResult([], f"namespace {namespace} is the gateway's own")
    if namespace in SYSTEM_NAMESPACES:
        return InjectionResult([], f"namespace {namespace} is a system namespace")
    pod_choice = _pod_choice(metadata, warnings)
    if pod_choice == "false":
        return InjectionResult([], "the pod opted out", warnings)
    if _already_injected(metadata, spec):
        return InjectionResult([], "the pod already has the sidecar", warnings)
    namespace_opted_in = namespace_labels.get(INJECT_KEY) == NAMESPACE_OPT_IN_VALUE
    if not (pod_choice == "true" or namespace_opted_in):
        return InjectionResult([], "neither the pod nor its namespace opted in", warnings)
    if spec.get("hostNetwork"):
        warnings.append(
            "llm-gateway sidecar not injected: the pod uses hostNetwork, where the sidecar's "
            "loopback ports would collide with other pods on the node"
        )
        return InjectionResult([], "the pod uses the host network", warnings)

    pod_settings = _settings_for_pod(settings, annotations)
    gateway_key = _gateway_key_ref(annotations)
    no_proxy = _no_proxy_for_pod(pod_settings.no_proxy, annotations)
    _refuse_collisions(spec, pod_settings)
    warnings.extend(_port_warnings(spec, pod_settings))

    patch: list[dict[str, Any]] = []
    sidecar = _sidecar_container(pod_settings)
    init_containers = spec.get("initContainers") or []
    # First init container: every later init container and app container then starts only
    # once the sidecar's startup probe has seen the CA bundle.
    if init_containers:
        patch.append({"op": "add", "path": "/spec/initContainers/0", "value": sidecar})
    else:
        patch.append({"op": "add", "path": "/spec/initContainers", "value": [sidecar]})

    _append_items(patch, "/spec/volumes", spec.get("volumes"), _pod_volumes(pod_settings))

    app_env = _app_env(pod_settings, no_proxy, gateway_key)
    app_mount = {"name": CA_BUNDLE_VOLUME, "mountPath": CA_BUNDLE_DIR, "readOnly": True}
    for index, container in enumerate(spec.get("containers") or []):
        base = f"/spec/containers/{index}"
        existing_env = container.get("env") or []
        existing_names = {item.get("name") for item in existing_env}
        new_env = [item for item in app_env if item["name"] not in existing_names]
        # The app's own value wins: it may point at its own proxy or CA on purpose.
        kept = sorted({item["name"] for item in app_env} & existing_names)
        if kept:
            warnings.append(
                f"container {container.get('name')!r} keeps its own {', '.join(kept)}; "
                "the sidecar's values for these were not injected"
            )
        _append_items(patch, f"{base}/env", existing_env, new_env)
        _append_items(patch, f"{base}/volumeMounts", container.get("volumeMounts"), [app_mount])

    # The mark that makes a second review (reinvocation, a re-sent request) a no-op.
    if metadata.get("annotations") is not None:
        status_path = f"/metadata/annotations/{_pointer(STATUS_ANNOTATION)}"
        patch.append({"op": "add", "path": status_path, "value": STATUS_INJECTED})
    else:
        status = {STATUS_ANNOTATION: STATUS_INJECTED}
        patch.append({"op": "add", "path": "/metadata/annotations", "value": status})
    reason = "the pod opted in" if pod_choice == "true" else "its namespace opted in"
    return InjectionResult(patch, reason, warnings)


def _pod_choice(metadata: Mapping[str, Any], warnings: list[str]) -> str:
    """The pod's own "true"/"false" (the annotation wins over the label), or ""."""
    for source in ("annotations", "labels"):
        values = metadata.get(source) or {}
        if INJECT_KEY not in values:
            continue
        choice = str(values[INJECT_KEY]).strip().lower()
        if choice in {"true", "false"}:
            return choice
        warnings.append(
            f'{source[:-1]} {INJECT_KEY}="{values[INJECT_KEY]}" is neither "true" nor "false" '
            "and was ignored"
        )
    return ""


def _already_injected(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    if (metadata.get("annotations") or {}).get(STATUS_ANNOTATION) == STATUS_INJECTED:
        return True
    # A pod that declares the sidecar itself (like the example Deployment) counts as injected.
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return any(container.get("name") == SIDECAR_CONTAINER_NAME for container in containers)


def _settings_for_pod(
    settings: InjectorSettings, annotations: Mapping[str, str]
) -> InjectorSettings:
    resources = {kind: dict(values) for kind, values in settings.sidecar_resources.items()}
    for annotation, (kind, resource) in RESOURCE_ANNOTATIONS.items():
        if annotation in annotations:
            resources.setdefault(kind, {})[resource] = _checked_quantity(
                annotation, annotations[annotation], refuse=True
            )
    for resource in ("cpu", "memory"):
        request = resources.get("requests", {}).get(resource)
        limit = resources.get("limits", {}).get(resource)
        if request and limit and _quantity_value(request) > _quantity_value(limit):
            raise InjectionRefused(
                f"llm-gateway sidecar {resource} request {request} exceeds its limit {limit}; "
                "adjust the llm-gateway.io/sidecar-* annotations"
            )
    proxy_port = settings.proxy_port
    admin_port = settings.admin_port
    if PROXY_PORT_ANNOTATION in annotations:
        proxy_port = _checked_port(PROXY_PORT_ANNOTATION, annotations[PROXY_PORT_ANNOTATION], True)
    if ADMIN_PORT_ANNOTATION in annotations:
        admin_port = _checked_port(ADMIN_PORT_ANNOTATION, annotations[ADMIN_PORT_ANNOTATION], True)
    if proxy_port == admin_port:
        raise InjectionRefused(
            f"llm-gateway sidecar proxy and admin ports are both {proxy_port}; set "
            f"{PROXY_PORT_ANNOTATION} or {ADMIN_PORT_ANNOTATION} to different ports"
        )
    ca_secret = settings.ca_secret
    if CA_SECRET_ANNOTATION in annotations:
        ca_secret = annotations[CA_SECRET_ANNOTATION].strip()
        if not _DNS_SUBDOMAIN_RE.match(ca_secret) or len(ca_secret) > 253:
            raise InjectionRefused(
                f'{CA_SECRET_ANNOTATION}="{ca_secret}" is not a valid Secret name'
            )
    return replace(
        settings,
        sidecar_resources=resources,
        proxy_port=proxy_port,
        admin_port=admin_port,
        ca_secret=ca_secret,
    )


def _gateway_key_ref(annotations: Mapping[str, str]) -> dict[str, str] | None:
    secret_name = annotations.get(GATEWAY_KEY_SECRET_ANNOTATION, "").strip()
    secret_key = annotations.get(GATEWAY_KEY_SECRET_KEY_ANNOTATION, "").strip()
    if not secret_name:
        if secret_key:
            raise InjectionRefused(
                f"{GATEWAY_KEY_SECRET_KEY_ANNOTATION} is set but {GATEWAY_KEY_SECRET_ANNOTATION} "
                "(the Secret's name) is not"
            )
        return None
    if not _DNS_SUBDOMAIN_RE.match(secret_name) or len(secret_name) > 253:
        raise InjectionRefused(
            f'{GATEWAY_KEY_SECRET_ANNOTATION}="{secret_name}" is not a valid Secret name'
        )
    secret_key = secret_key or DEFAULT_GATEWAY_KEY_SECRET_KEY
    if not _SECRET_KEY_RE.match(secret_key) or len(secret_key) > 253:
        raise InjectionRefused(
            f'{GATEWAY_KEY_SECRET_KEY_ANNOTATION}="{secret_key}" is not a valid Secret key'
        )
    return {"name": secret_name, "key": secret_key}


def _no_proxy_for_pod(default: str, annotations: Mapping[str, str]) -> str:
    extra = [item.strip() for item in annotations.get(NO_PROXY_ANNOTATION, "").split(",")]
    entries = [item.strip() for item in default.split(",")] + extra
    return ",".join(dict.fromkeys(item for item in entries if item))


def _refuse_collisions(spec: Mapping[str, Any], settings: InjectorSettings) -> None:
    ours = {volume["name"] for volume in _pod_volumes(settings)}
    clashing = sorted(ours & {volume.get("name") for volume in spec.get("volumes") or []})
    if clashing:
        raise InjectionRefused(
            f"the pod already has volume(s) {', '.join(clashing)} that the llm-gateway sidecar "
            'needs; rename them or opt out with llm-gateway.io/inject: "false"'
        )
    for container in spec.get("containers") or []:
        paths = {
            mount.get("mountPath", "").rstrip("/") for mount in container.get("volumeMounts") or []
        }
        if CA_BUNDLE_DIR in paths:
            raise InjectionRefused(
                f"container {container.get('name')!r} already mounts something at "
                f"{CA_BUNDLE_DIR}, where the llm-gateway CA bundle goes"
            )


def _port_warnings(spec: Mapping[str, Any], settings: InjectorSettings) -> list[str]:
    # Containers share the pod's network namespace: an app bound to 0.0.0.0 on the proxy or
    # admin port stops the sidecar from binding (or the other way round).
    sidecar_ports = {
        settings.proxy_port: PROXY_PORT_ANNOTATION,
        settings.admin_port: ADMIN_PORT_ANNOTATION,
    }
    warnings = []
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for port in container.get("ports") or []:
            annotation = sidecar_ports.get(port.get("containerPort"))
            if annotation:
                warnings.append(
                    f"container {container.get('name')!r} declares port "
                    f"{port.get('containerPort')}, which the llm-gateway sidecar also uses; "
                    f"set {annotation} to move the sidecar"
                )
    return warnings


def _sidecar_container(settings: InjectorSettings) -> dict[str, Any]:
    ca_is_secret = bool(settings.ca_secret)
    mounts: list[dict[str, Any]] = [
        {"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": ca_is_secret},
        {"name": CA_BUNDLE_VOLUME, "mountPath": CA_BUNDLE_DIR},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
    ]
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
    ]
    if settings.config_map:
        mounts.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
        env.append({"name": "LLM_GATEWAY_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE_KEY}"})
    admin_probe = {"path": "/readyz", "port": settings.admin_port}
    return {
        "name": SIDECAR_CONTAINER_NAME,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.image_pull_policy,
        "restartPolicy": "Always",
        "args": [
            "sidecar",
            "--listen",
            f"127.0.0.1:{settings.proxy_port}",
            # Probes come from the kubelet to the pod IP, so the admin port cannot be loopback.
            "--admin",
            f"0.0.0.0:{settings.admin_port}",
            "--ca-dir",
            CA_DIR,
            "--ca-bundle-out",
            CA_BUNDLE_FILE,
        ],
        "env": env,
        "envFrom": [
            {"secretRef": {"name": settings.provider_secret}},
            {"secretRef": {"name": settings.datastore_secret}},
        ],
        # /readyz answers only once the CA bundle exists: until then no other container starts.
        "startupProbe": {
            "httpGet": admin_probe,
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 120,
        },
        "readinessProbe": {"httpGet": admin_probe, "periodSeconds": 10, "timeoutSeconds": 2},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": settings.admin_port},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": {kind: dict(values) for kind, values in settings.sidecar_resources.items()},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }


def _pod_volumes(settings: InjectorSettings) -> list[dict[str, Any]]:
    ca_volume: dict[str, Any] = {"name": CA_VOLUME}
    if settings.ca_secret:
        # 0444: the sidecar runs as a non-root user the Secret's files are not owned by.
        ca_volume["secret"] = {"secretName": settings.ca_secret, "defaultMode": 0o444}
    else:
        ca_volume["emptyDir"] = {"medium": "Memory", "sizeLimit": "1Mi"}
    volumes = [
        ca_volume,
        # Public roots plus the gateway CA: a few hundred KiB.
        {"name": CA_BUNDLE_VOLUME, "emptyDir": {"sizeLimit": "4Mi"}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if settings.config_map:
        volumes.append({"name": CONFIG_VOLUME, "configMap": {"name": settings.config_map}})
    return volumes


def _app_env(
    settings: InjectorSettings, no_proxy: str, gateway_key: dict[str, str] | None
) -> list[dict[str, Any]]:
    proxy_url = f"http://127.0.0.1:{settings.proxy_port}"
    # Only HTTPS goes through the sidecar: plain-HTTP requests cannot be passed through it
    # untouched, so HTTP_PROXY stays unset. Lower-case twins exist for curl, wget and Go.
    env: list[dict[str, Any]] = [
        {"name": "HTTPS_PROXY", "value": proxy_url},
        {"name": "https_proxy", "value": proxy_url},
        {"name": "NO_PROXY", "value": no_proxy},
        {"name": "no_proxy", "value": no_proxy},
        # SSL_CERT_FILE replaces a client's roots, so the bundle holds public roots too.
        {"name": "SSL_CERT_FILE", "value": CA_BUNDLE_FILE},
        {"name": "REQUESTS_CA_BUNDLE", "value": CA_BUNDLE_FILE},
        {"name": "NODE_EXTRA_CA_CERTS", "value": CA_BUNDLE_FILE},
        # Node's built-in fetch ignores HTTPS_PROXY without it (Node >= 22.21 / 24.5).
        {"name": "NODE_USE_ENV_PROXY", "value": "1"},
    ]
    if gateway_key:
        env.append({"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": dict(gateway_key)}})
    return env


def _append_items(
    patch: list[dict[str, Any]], path: str, existing: list[Any] | None, items: list[Any]
) -> None:
    if not items:
        return
    if existing:
        patch.extend({"op": "add", "path": f"{path}/-", "value": item} for item in items)
    else:
        # "add" on a missing (or null) member creates it.
        patch.append({"op": "add", "path": path, "value": list(items)})


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _checked_quantity(source: str, value: str, refuse: bool = False) -> str:
    value = str(value).strip()
    if not _QUANTITY_RE.match(value) or _quantity_value(value) < 0:
        message = f'{source}="{value}" is not a Kubernetes resource quantity (e.g. 100m, 256Mi)'
        raise InjectionRefused(message) if refuse else ValueError(message)
    return value


def _quantity_value(value: str) -> Decimal:
    match = _QUANTITY_RE.match(value)
    if not match:
        raise ValueError(f"not a quantity: {value}")
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY_SUFFIXES:
        return number * (Decimal(1024) ** _BINARY_SUFFIXES[suffix])
    if suffix in _DECIMAL_EXPONENTS:
        return number.scaleb(_DECIMAL_EXPONENTS[suffix])
    return number.scaleb(int(Decimal(suffix[1:])))


def _checked_port(source: str, value: str, refuse: bool = False) -> int:
    text = str(value).strip()
    if text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    message = f'{source}="{value}" is not a port number (1-65535)'
    raise InjectionRefused(message) if refuse else ValueError(message)


# --- the ASGI app -----------------------------------------------------------------------------

# The namespace-selected webhook entry calls /mutate: by the time a review arrives there, the
# API server has matched the namespace label, which the review itself does not carry.
_NAMESPACE_LABELS_BY_PATH: dict[str, dict[str, str]] = {
    "/mutate": {INJECT_KEY: NAMESPACE_OPT_IN_VALUE},
    "/mutate/annotated": {},
}


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_injector_app(settings: InjectorSettings | None = None) -> ASGIApp:
    """The webhook as a plain ASGI app: POST /mutate, POST /mutate/annotated, GET /healthz."""
    injector_settings = settings or InjectorSettings.from_env()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        method = scope["method"]
        if path in {"/healthz", "/readyz"}:
            if method not in {"GET", "HEAD"}:
                await _send_json(send, 405, {"error": "method not allowed"})
                return
            await _send_json(send, 200, {"status": "ok"})
            return
        if path not in _NAMESPACE_LABELS_BY_PATH:
            await _send_json(send, 404, {"error": "not found"})
            return
        if method != "POST":
            await _send_json(send, 405, {"error": "method not allowed"})
            return
        try:
            review = json.loads(await _read_body(scope, receive))
            answer = review_admission(
                review, _NAMESPACE_LABELS_BY_PATH[path], settings=injector_settings
            )
        except _BadRequest as error:
            await _send_json(send, error.status, {"error": str(error)})
            return
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            await _send_json(send, 400, {"error": f"body is not JSON: {error}"})
            return
        await _send_json(send, 200, answer)

    return app


def review_admission(
    review: Any, namespace_labels: Mapping[str, str], *, settings: InjectorSettings
) -> dict[str, Any]:
    """Answer one AdmissionReview v1 request with an AdmissionReview v1 response."""
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise _BadRequest(400, "expected an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise _BadRequest(400, "only admission.k8s.io/v1 AdmissionReviews are supported")
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise _BadRequest(400, "the AdmissionReview has no request uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    kind = request.get("kind") or {}
    pod = request.get("object")
    if (
        kind.get("group", "") != ""
        or kind.get("kind") != "Pod"
        or request.get("operation") != "CREATE"
        or request.get("subResource")
        or not isinstance(pod, dict)
    ):
        return answer
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace", "")
    pod_label = _describe_pod(pod, namespace)
    try:
        result = plan_injection(pod, namespace_labels, namespace=namespace, settings=settings)
    except InjectionRefused as refusal:
        logger.warning("refused %s: %s", pod_label, refusal)
        response["allowed"] = False
        response["status"] = {"code": 400, "reason": "BadRequest", "message": str(refusal)}
        return answer
    if result.warnings:
        response["warnings"] = result.warnings
    if result.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(result.patch, separators=(",", ":")).encode()
        ).decode()
        logger.info("injected %s: %s", pod_label, result.reason)
    else:
        logger.info("left %s alone: %s", pod_label, result.reason)
    return answer


def _describe_pod(pod: Mapping[str, Any], namespace: str) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or f"{metadata.get('generateName', '')}<generated>"
    return f"pod {namespace}/{name}"


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    for header, value in scope.get("headers") or []:
        if header == b"content-length" and value.isdigit() and int(value) > MAX_REVIEW_BYTES:
            raise _BadRequest(413, "AdmissionReview too large")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _BadRequest(400, "client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REVIEW_BYTES:
            raise _BadRequest(413, "AdmissionReview too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})




# --- TLS and the command line -----------------------------------------------------------------


class ReloadingCertificate:
    """Serves the newest certificate in ``cert_file``/``key_file`` without a restart.

    cert-manager renews the serving certificate in place (the mounted Secret's files change);
    a webhook that kept its startup certificate would start failing TLS at expiry, and with
    ``failurePolicy: Ignore`` pods would silently start without the sidecar.
    """

    def __init__(self, cert_file: str, key_file: str, check_interval_seconds: float = 10.0):
        self.cert_file = cert_file
        self.key_file = key_file
        self.check_interval_seconds = check_interval_seconds
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._context = self._load()
        self._checked_at = time.monotonic()

    def install(self, server_context: ssl.SSLContext) -> None:
        """Make every handshake on ``server_context`` use the current certificate."""

        def choose_context(
            sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any
        ) -> None:
            sock.context = self.current_context()

        server_context.sni_callback = choose_context

    def current_context(self) -> ssl.SSLContext:
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at >= self.check_interval_seconds:
                self._checked_at = now
                stamp = self._file_stamp()
                if stamp != self._stamp:
                    try:
                        self._context = self._load()
                        self._stamp = stamp
                        logger.info("reloaded the TLS certificate from %s", self.cert_file)
                    except (OSError, ssl.SSLError) as error:
                        # Mid-rotation the key and certificate may not match yet: keep serving
                        # the previous pair and try again on a later handshake.
                        logger.warning("could not reload the TLS certificate yet: %s", error)
            return self._context

    def _file_stamp(self) -> tuple[float, float]:
        return (os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _parse_listen(value: str) -> tuple[str, int]:
    host, separator, port = value.rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway injector",
        description=(
            "Mutating admission webhook that injects the llm-gateway sidecar into pods "
            "(POST /mutate, POST /mutate/annotated, GET /healthz). The sidecar's image, "
            "Secrets and sizes come from LLM_GATEWAY_* environment variables."
        ),
    )
    parser.add_argument(
        "--listen",
        default="0.0.0.0:8443",
        type=_parse_listen,
        metavar="HOST:PORT",
        help="address to serve on (default: 0.0.0.0:8443)",
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM serving certificate (chain)")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default: info)",
    )
    return parser


def injector_main(argv: list[str]) -> int:
    """``llm-gateway injector [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE]``."""
    parser = _argument_parser()
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    try:
        settings = InjectorSettings.from_env()
    except ValueError as error:
        print(f"llm-gateway injector: {error}", file=sys.stderr)
        return 2

    import uvicorn  # imported here so that `mutate_pod` stays usable without the server stack

    # `llm-gateway` may have configured logging already; the level is ours to set either way.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(args.log_level.upper())
    host, port = args.listen
    config = uvicorn.Config(
        create_injector_app(settings),
        host=host,
        port=port,
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        log_level=args.log_level,
        # The API server reuses connections for its reviews.
        timeout_keep_alive=30,
        # Each decision is logged already; probes every few seconds would drown it.
        access_log=False,
    )
    if args.tls_cert:
        try:
            config.load()
        except (OSError, ssl.SSLError) as error:
            print(f"llm-gateway injector: cannot load the TLS key pair: {error}", file=sys.stderr)
            return 2
        assert config.ssl is not None
        ReloadingCertificate(args.tls_cert, args.tls_key).install(config.ssl)
    else:
        print(
            f"WARNING: llm-gateway injector is serving plain HTTP on {host}:{port}. The "
            "Kubernetes API server calls webhooks over HTTPS only: this is for local tests. "
            "Pass --tls-cert and --tls-key to serve HTTPS.",
            file=sys.stderr,
            flush=True,
        )
    logger.info(
        "injecting %s (own namespace %s, provider Secret %s)",
        settings.sidecar_image,
        settings.own_namespace,
        settings.provider_secret,
    )
    uvicorn.Server(config).run()
    return 0
