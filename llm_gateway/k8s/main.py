"""``llm-gateway injector``: the command line that serves the webhook with uvicorn."""

from __future__ import annotations

import argparse
import logging
import ssl
import sys

import uvicorn

from llm_gateway.config import host_port_argument
from llm_gateway.k8s.settings import InjectorSettings
from llm_gateway.k8s.webhook import ReloadingCertificate, create_injector_app, logger


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
        type=host_port_argument,
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

    # `llm-gateway` may have configured logging already; the level is ours to set either way.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(args.log_level.upper())
    config = _server_config(args, settings)
    if args.tls_cert:
        try:
            config.load()
        except (OSError, ssl.SSLError) as error:
            print(f"llm-gateway injector: cannot load the TLS key pair: {error}", file=sys.stderr)
            return 2
        assert config.ssl is not None
        ReloadingCertificate(args.tls_cert, args.tls_key).install(config.ssl)
    else:
        host, port = args.listen
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


def _server_config(args: argparse.Namespace, settings: InjectorSettings) -> uvicorn.Config:
    return uvicorn.Config(
        create_injector_app(settings),
        host=args.listen.host,
        port=args.listen.port,
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        log_level=args.log_level,
        # uvicorn's lines through the process's handler: JSON too with LOG_FORMAT=json.
        log_config=None,
        # The API server reuses connections for its reviews.
        timeout_keep_alive=30,
        # Each decision is logged already; probes every few seconds would drown it.
        access_log=False,
    )
