"""The injector over HTTP: an ASGI app that answers AdmissionReviews, and its TLS certificate.

``POST /mutate`` and ``POST /mutate/annotated`` take an AdmissionReview v1 and answer with one
that carries the JSONPatch from :mod:`llm_gateway.k8s.plan`; ``GET /healthz`` and
``GET /readyz`` answer the kubelet's probes.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from llm_gateway.asgi_types import ASGIApp, Receive, Scope, Send, answer_lifespan, send_body
from llm_gateway.k8s.plan import InjectionRefused, plan_injection
from llm_gateway.k8s.settings import INJECT_KEY, NAMESPACE_OPT_IN_VALUE, InjectorSettings

# The module's name before it became a package, so that log filters set up for it still match.
logger = logging.getLogger("llm_gateway.injector")

MAX_REVIEW_BYTES = 8 * 1024 * 1024

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
        status, payload = await _http_answer(scope, receive, injector_settings)
        await _send_json(send, status, payload)

    return app


async def _http_answer(
    scope: Scope, receive: Receive, settings: InjectorSettings
) -> tuple[int, Any]:
    """The status and JSON payload that answer one HTTP request."""
    path = scope["path"]
    method = scope["method"]
    if path in {"/healthz", "/readyz"}:
        if method not in {"GET", "HEAD"}:
            return 405, {"error": "method not allowed"}
        return 200, {"status": "ok"}
    if path not in _NAMESPACE_LABELS_BY_PATH:
        return 404, {"error": "not found"}
    if method != "POST":
        return 405, {"error": "method not allowed"}
    try:
        review = json.loads(await _read_body(scope, receive))
        return 200, review_admission(review, _NAMESPACE_LABELS_BY_PATH[path], settings=settings)
    except _BadRequest as error:
        return error.status, {"error": str(error)}
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return 400, {"error": f"body is not JSON: {error}"}


def review_admission(
    review: Any, namespace_labels: Mapping[str, str], *, settings: InjectorSettings
) -> dict[str, Any]:
    """Answer one AdmissionReview v1 request with an AdmissionReview v1 response."""
    request = _admission_request(review)
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
    response.update(_decision(pod, namespace, namespace_labels, settings))
    return answer


def _admission_request(review: Any) -> dict[str, Any]:
    """The ``request`` of a well-formed AdmissionReview v1; raises :class:`_BadRequest`."""
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise _BadRequest(400, "expected an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise _BadRequest(400, "only admission.k8s.io/v1 AdmissionReviews are supported")
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise _BadRequest(400, "the AdmissionReview has no request uid")
    return request


def _decision(
    pod: Mapping[str, Any],
    namespace: str,
    namespace_labels: Mapping[str, str],
    settings: InjectorSettings,
) -> dict[str, Any]:
    """The response fields that carry the plan for ``pod``: a refusal, or warnings and a patch."""
    pod_label = _describe_pod(pod, namespace)
    try:
        result = plan_injection(pod, namespace_labels, namespace=namespace, settings=settings)
    except InjectionRefused as refusal:
        logger.warning("refused %s: %s", pod_label, refusal)
        status = {"code": 400, "reason": "BadRequest", "message": str(refusal)}
        return {"allowed": False, "status": status}
    decision: dict[str, Any] = {}
    if result.warnings:
        decision["warnings"] = result.warnings
    if result.patch:
        decision["patchType"] = "JSONPatch"
        decision["patch"] = base64.b64encode(
            json.dumps(result.patch, separators=(",", ":")).encode()
        ).decode()
        logger.info("injected %s: %s", pod_label, result.reason)
    else:
        logger.info("left %s alone: %s", pod_label, result.reason)
    return decision


def _describe_pod(pod: Mapping[str, Any], namespace: str) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or f"{metadata.get('generateName', '')}<generated>"
    return f"pod {namespace}/{name}"


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    for header, value in scope.get("headers") or []:
        if header == b"content-length" and value.isdigit():
            _refuse_oversized(int(value))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _BadRequest(400, "client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        _refuse_oversized(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _refuse_oversized(size: int) -> None:
    # Checked on the announced length and again on what arrives: a client may announce none.
    if size > MAX_REVIEW_BYTES:
        raise _BadRequest(413, "AdmissionReview too large")


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send_body(send, status, body, [("content-type", "application/json")])


class ReloadingCertificate:
    """Serves the newest certificate in ``cert_file``/``key_file`` without a restart.

    cert-manager renews the serving certificate in place (the mounted Secret's files change);
    a webhook that kept its startup certificate would start failing TLS at expiry, and with
    ``failurePolicy: Ignore`` pods would silently start without the sidecar.
    """

    def __init__(self, cert_file: str, key_file: str, check_interval_seconds: float = 10.0) -> None:
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
