"""The ASGI middleware and standalone app, where users look for them.

    from asgi_middleware import GatewayMiddleware, create_app

The adapter itself is ``llm_gateway.adapters.asgi``; this package only names it.
"""

from llm_gateway.adapters.asgi import GatewayMiddleware, create_app

__all__ = ["GatewayMiddleware", "create_app"]
