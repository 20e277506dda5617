"""The Kubernetes pod-injection webhook: a separate application from the gateway engine.

It puts the llm-gateway sidecar into the pods that opt in. :mod:`~llm_gateway.k8s.settings`
holds what it injects and the names it uses, :mod:`~llm_gateway.k8s.plan` decides on one pod
(a JSONPatch, no I/O), :mod:`~llm_gateway.k8s.webhook` answers AdmissionReviews over ASGI and
:mod:`~llm_gateway.k8s.main` is ``llm-gateway injector``.

Only the standard library is loaded from here: the server (uvicorn) comes with
:mod:`~llm_gateway.k8s.main` alone.
"""

from llm_gateway.k8s.plan import InjectionRefused, InjectionResult, mutate_pod, plan_injection
from llm_gateway.k8s.settings import (
    CA_BUNDLE_FILE,
    INJECT_KEY,
    NAMESPACE_OPT_IN_VALUE,
    SIDECAR_CONTAINER_NAME,
    SIDECAR_UID,
    InjectorSettings,
)
from llm_gateway.k8s.webhook import ReloadingCertificate, create_injector_app, review_admission

__all__ = [
    "CA_BUNDLE_FILE",
    "INJECT_KEY",
    "NAMESPACE_OPT_IN_VALUE",
    "SIDECAR_CONTAINER_NAME",
    "SIDECAR_UID",
    "InjectionRefused",
    "InjectionResult",
    "InjectorSettings",
    "ReloadingCertificate",
    "create_injector_app",
    "mutate_pod",
    "plan_injection",
    "review_admission",
]
