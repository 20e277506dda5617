"""Whether and how to inject the llm-gateway sidecar into one pod: a JSONPatch, no I/O.

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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from llm_gateway.k8s.settings import (
    ADMIN_PORT_ANNOTATION,
    CA_BUNDLE_DIR,
    CA_BUNDLE_FILE,
    CA_BUNDLE_VOLUME,
    CA_SECRET_ANNOTATION,
    CA_VOLUME,
    CONFIG_VOLUME,
    DEFAULT_GATEWAY_KEY_SECRET_KEY,
    GATEWAY_KEY_SECRET_ANNOTATION,
    GATEWAY_KEY_SECRET_KEY_ANNOTATION,
    INJECT_KEY,
    NAMESPACE_OPT_IN_VALUE,
    NO_PROXY_ANNOTATION,
    PROXY_PORT_ANNOTATION,
    RESOURCE_ANNOTATIONS,
    SIDECAR_CONTAINER_NAME,
    SPOOL_VOLUME,
    STATUS_ANNOTATION,
    STATUS_INJECTED,
    SYSTEM_NAMESPACES,
    TMP_VOLUME,
    InjectorSettings,
    port_from,
    quantity_value,
    resources_with,
)
from llm_gateway.k8s.sidecar_container import sidecar_container

_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")

Operation = dict[str, Any]


class InjectionRefused(ValueError):
    """The pod asked for injection in a way that cannot be honoured (e.g. a bad annotation).

    The webhook denies such a pod with this message rather than let it start without the
    proxy, where its requests would reach the provider with a gateway key and fail obscurely.
    """


@dataclass
class InjectionResult:
    """A decision: the patch (empty: leave the pod alone), why, and what to warn about."""

    patch: list[Operation]
    reason: str
    warnings: list[str] = field(default_factory=list)


def mutate_pod(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    *,
    namespace: str,
    settings: InjectorSettings | None = None,
) -> list[Operation]:
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
    spec = pod.get("spec") or {}
    # Before the pod's own choice is read: these namespaces are never touched, so a malformed
    # opt-in there is not worth a warning.
    if namespace == settings.own_namespace:
        return InjectionResult([], f"namespace {namespace} is the gateway's own")
    if namespace in SYSTEM_NAMESPACES:
        return InjectionResult([], f"namespace {namespace} is a system namespace")
    warnings: list[str] = []
    pod_choice = _pod_choice(metadata, warnings)
    namespace_opted_in = namespace_labels.get(INJECT_KEY) == NAMESPACE_OPT_IN_VALUE
    reason_to_skip = _reason_to_skip(pod_choice, namespace_opted_in, metadata, spec, warnings)
    if reason_to_skip:
        return InjectionResult([], reason_to_skip, warnings)
    patch = _injection_patch(metadata, spec, settings, warnings)
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


def _reason_to_skip(
    pod_choice: str,
    namespace_opted_in: bool,
    metadata: Mapping[str, Any],
    spec: Mapping[str, Any],
    warnings: list[str],
) -> str | None:
    """Why a pod outside the excluded namespaces is left alone, or None to inject it."""
    if pod_choice == "false":
        return "the pod opted out"
    if _already_injected(metadata, spec):
        return "the pod already has the sidecar"
    if not (pod_choice == "true" or namespace_opted_in):
        return "neither the pod nor its namespace opted in"
    if spec.get("hostNetwork"):
        warnings.append(
            "llm-gateway sidecar not injected: the pod uses hostNetwork, where the sidecar's "
            "loopback ports would collide with other pods on the node"
        )
        return "the pod uses the host network"
    return None


def _already_injected(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    if (metadata.get("annotations") or {}).get(STATUS_ANNOTATION) == STATUS_INJECTED:
        return True
    # A pod that declares the sidecar itself (like the example Deployment) counts as injected.
    return any(container.get("name") == SIDECAR_CONTAINER_NAME for container in _containers(spec))


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init and app containers alike: they share the pod's names and network namespace."""
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _injection_patch(
    metadata: Mapping[str, Any],
    spec: Mapping[str, Any],
    settings: InjectorSettings,
    warnings: list[str],
) -> list[Operation]:
    """The operations that add the sidecar, its volumes and the app containers' settings."""
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    pod_settings = _settings_for_pod(settings, annotations)
    gateway_key = _gateway_key_ref(annotations)
    no_proxy = _no_proxy_for_pod(pod_settings.no_proxy, annotations)
    _refuse_collisions(spec, pod_settings)
    warnings.extend(_port_warnings(spec, pod_settings))

    # First init container: every later init container and app container then starts only
    # once the sidecar's startup probe has seen the CA bundle.
    sidecar = sidecar_container(pod_settings)
    patch = _add_items("/spec/initContainers", spec.get("initContainers"), [sidecar], at="0")
    patch += _add_items("/spec/volumes", spec.get("volumes"), _pod_volumes(pod_settings))
    app_env = _app_env(pod_settings, no_proxy, gateway_key)
    for index, container in enumerate(spec.get("containers") or []):
        patch += _app_container_patch(index, container, app_env, warnings)
    patch.append(_status_operation(metadata))
    return patch


def _settings_for_pod(
    settings: InjectorSettings, annotations: Mapping[str, str]
) -> InjectorSettings:
    resources = resources_with(
        settings.sidecar_resources, RESOURCE_ANNOTATIONS, annotations, InjectionRefused
    )
    _refuse_requests_over_limits(resources)
    proxy_port = port_from(
        annotations, PROXY_PORT_ANNOTATION, settings.proxy_port, InjectionRefused
    )
    admin_port = port_from(
        annotations, ADMIN_PORT_ANNOTATION, settings.admin_port, InjectionRefused
    )
    if proxy_port == admin_port:
        raise InjectionRefused(
            f"llm-gateway sidecar proxy and admin ports are both {proxy_port}; set "
            f"{PROXY_PORT_ANNOTATION} or {ADMIN_PORT_ANNOTATION} to different ports"
        )
    ca_secret = settings.ca_secret
    if CA_SECRET_ANNOTATION in annotations:
        ca_secret = _checked_secret_name(
            CA_SECRET_ANNOTATION, annotations[CA_SECRET_ANNOTATION].strip()
        )
    return replace(
        settings,
        sidecar_resources=resources,
        proxy_port=proxy_port,
        admin_port=admin_port,
        ca_secret=ca_secret,
    )


def _refuse_requests_over_limits(resources: Mapping[str, Mapping[str, str]]) -> None:
    for resource in ("cpu", "memory"):
        request = resources.get("requests", {}).get(resource)
        limit = resources.get("limits", {}).get(resource)
        if request and limit and quantity_value(request) > quantity_value(limit):
            raise InjectionRefused(
                f"llm-gateway sidecar {resource} request {request} exceeds its limit {limit}; "
                "adjust the llm-gateway.io/sidecar-* annotations"
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
    _checked_secret_name(GATEWAY_KEY_SECRET_ANNOTATION, secret_name)
    secret_key = secret_key or DEFAULT_GATEWAY_KEY_SECRET_KEY
    if not _SECRET_KEY_RE.match(secret_key) or len(secret_key) > 253:
        raise InjectionRefused(
            f'{GATEWAY_KEY_SECRET_KEY_ANNOTATION}="{secret_key}" is not a valid Secret key'
        )
    return {"name": secret_name, "key": secret_key}


def _checked_secret_name(annotation: str, name: str) -> str:
    if not _DNS_SUBDOMAIN_RE.match(name) or len(name) > 253:
        raise InjectionRefused(f'{annotation}="{name}" is not a valid Secret name')
    return name


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
    for container in _containers(spec):
        for port in container.get("ports") or []:
            annotation = sidecar_ports.get(port.get("containerPort"))
            if annotation:
                warnings.append(
                    f"container {container.get('name')!r} declares port "
                    f"{port.get('containerPort')}, which the llm-gateway sidecar also uses; "
                    f"set {annotation} to move the sidecar"
                )
    return warnings


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
        # Usage records only while the database does not take them: about 1 KiB each.
        {"name": SPOOL_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
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
        # The SDKs' own variables (openai, anthropic; Claude Code reads the latter): the app
        # holds its gateway key where its client looks for a provider key.
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            env.append({"name": name, "valueFrom": {"secretKeyRef": dict(gateway_key)}})
    return env


def _app_container_patch(
    index: int, container: Mapping[str, Any], app_env: list[dict[str, Any]], warnings: list[str]
) -> list[Operation]:
    """The operations that give one app container the proxy variables and the CA bundle."""
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
    mount = {"name": CA_BUNDLE_VOLUME, "mountPath": CA_BUNDLE_DIR, "readOnly": True}
    return [
        *_add_items(f"{base}/env", existing_env, new_env),
        *_add_items(f"{base}/volumeMounts", container.get("volumeMounts"), [mount]),
    ]


def _add_items(
    path: str, existing: list[Any] | None, items: list[Any], at: str = "-"
) -> list[Operation]:
    """Operations adding each of ``items`` at index ``at`` ("-": the end) of the array at ``path``.

    A pod without the array gets it created with ``items`` instead.
    """
    if not items:
        return []
    if existing:
        return [{"op": "add", "path": f"{path}/{at}", "value": item} for item in items]
    # "add" on a missing (or null) member creates it.
    return [{"op": "add", "path": path, "value": list(items)}]


def _status_operation(metadata: Mapping[str, Any]) -> Operation:
    """The mark that makes a second review (reinvocation, a re-sent request) a no-op."""
    if metadata.get("annotations") is not None:
        status_path = f"/metadata/annotations/{_pointer(STATUS_ANNOTATION)}"
        return {"op": "add", "path": status_path, "value": STATUS_INJECTED}
    status = {STATUS_ANNOTATION: STATUS_INJECTED}
    return {"op": "add", "path": "/metadata/annotations", "value": status}


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
