"""Adapters put the engine in the path of a request and only translate: ASGI (``serve``
and the middleware), the mitmproxy sidecar (and its CA)."""
