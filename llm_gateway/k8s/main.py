"""`llm-gateway injector`."""

from llm_gateway.k8s.plan import injector_main

__all__ = ["injector_main"]
