"""What the injector puts into pods: its settings, the names it uses, and their validation.

The validators take the exception to raise, because the same bad value is a start-up error
(``ValueError``) when it comes from the injector's environment and a refused pod
(:class:`~llm_gateway.k8s.plan.InjectionRefused`) when it comes from a pod's annotation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal

from llm_gateway.version import VERSION

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
RESOURCE_VARIABLES: dict[str, tuple[str, str]] = {
    "LLM_GATEWAY_SIDECAR_CPU_REQUEST": ("requests", "cpu"),
    "LLM_GATEWAY_SIDECAR_MEMORY_REQUEST": ("requests", "memory"),
    "LLM_GATEWAY_SIDECAR_CPU_LIMIT": ("limits", "cpu"),
    "LLM_GATEWAY_SIDECAR_MEMORY_LIMIT": ("limits", "memory"),
}

SIDECAR_CONTAINER_NAME = "llm-gateway-sidecar"
CA_VOLUME = "llm-gateway-ca"
CA_BUNDLE_VOLUME = "llm-gateway-ca-bundle"
TMP_VOLUME = "llm-gateway-tmp"
SPOOL_VOLUME = "llm-gateway-spool"
CONFIG_VOLUME = "llm-gateway-config"
CA_DIR = "/etc/llm-gateway/ca"
CA_BUNDLE_DIR = "/var/run/llm-gateway"
CA_BUNDLE_FILE = f"{CA_BUNDLE_DIR}/ca-bundle.pem"
CONFIG_DIR = "/etc/llm-gateway/config"
# Where the sidecar's usage records wait for the database (USAGE_SPOOL_DIR): an emptyDir,
# since the root file system is read-only; it outlives a restart of the sidecar container,
# so the next one replays what a killed one left.
SPOOL_DIR = "/var/lib/llm-gateway/spool"
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

Resources = Mapping[str, Mapping[str, str]]

# https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?$"
)
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_EXPONENTS |= {"P": 15, "E": 18}


@dataclass(frozen=True)
class InjectorSettings:
    """What the injector puts into pods; every field can be set from the environment."""

    sidecar_image: str = field(default_factory=lambda: _default_sidecar_image())
    image_pull_policy: str = "IfNotPresent"
    own_namespace: str = "llm-gateway"
    provider_secret: str = "llm-gateway-provider"
    datastore_secret: str = "llm-gateway-datastores"
    # METRICS_TOKEN for the sidecar's /metrics (an optional reference; empty: none).
    metrics_secret: str = "llm-gateway-metrics"
    # Empty: no gateway YAML is mounted and the sidecar runs on environment settings alone.
    config_map: str = "llm-gateway-config"
    # Empty: every pod gets a fresh CA in an emptyDir; otherwise the named Secret (for example
    # one that cert-manager keeps) is mounted read-only as the CA directory.
    ca_secret: str = ""
    proxy_port: int = 8080
    admin_port: int = 9090
    no_proxy: str = DEFAULT_NO_PROXY
    sidecar_resources: Resources = field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        }
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InjectorSettings:
        env = os.environ if environ is None else environ
        defaults = cls()
        quantities = {name: env[name] for name in RESOURCE_VARIABLES if env.get(name)}
        resources = resources_with(defaults.sidecar_resources, RESOURCE_VARIABLES, quantities)
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
            metrics_secret=env.get("LLM_GATEWAY_METRICS_SECRET", defaults.metrics_secret),
            config_map=env.get("LLM_GATEWAY_CONFIG_MAP", defaults.config_map),
            ca_secret=env.get("LLM_GATEWAY_CA_SECRET", defaults.ca_secret),
            proxy_port=port_from(env, "LLM_GATEWAY_SIDECAR_PROXY_PORT", defaults.proxy_port),
            admin_port=port_from(env, "LLM_GATEWAY_SIDECAR_ADMIN_PORT", defaults.admin_port),
            no_proxy=env.get("LLM_GATEWAY_NO_PROXY", defaults.no_proxy),
            sidecar_resources=resources,
        )
        if settings.proxy_port == settings.admin_port:
            raise ValueError("the sidecar's proxy and admin ports must differ")
        return settings


def _default_sidecar_image() -> str:
    # The image built from this very version; deployments set LLM_GATEWAY_SIDECAR_IMAGE.
    return f"llm-gateway:{VERSION}"


def copy_resources(resources: Resources) -> dict[str, dict[str, str]]:
    """A copy the caller may change without changing ``resources``."""
    return {kind: dict(values) for kind, values in resources.items()}


def resources_with(
    base: Resources,
    names: Mapping[str, tuple[str, str]],
    values: Mapping[str, str],
    error: type[ValueError] = ValueError,
) -> dict[str, dict[str, str]]:
    """``base`` with every quantity ``values`` holds under one of ``names`` (checked)."""
    resources = copy_resources(base)
    for name, (kind, resource) in names.items():
        if name in values:
            resources.setdefault(kind, {})[resource] = _checked_quantity(name, values[name], error)
    return resources


def port_from(
    values: Mapping[str, str], name: str, default: int, error: type[ValueError] = ValueError
) -> int:
    """The port ``values`` holds under ``name`` (checked), or ``default`` if it holds none."""
    if name not in values:
        return default
    text = str(values[name]).strip()
    if text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    raise error(f'{name}="{values[name]}" is not a port number (1-65535)')


def quantity_value(value: str) -> Decimal:
    """A Kubernetes resource quantity as a number, so that ``500m`` compares below ``1``."""
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


def _checked_quantity(source: str, value: str, error: type[ValueError]) -> str:
    value = str(value).strip()
    if not _QUANTITY_RE.match(value) or quantity_value(value) < 0:
        raise error(f'{source}="{value}" is not a Kubernetes resource quantity (e.g. 100m, 256Mi)')
    return value
