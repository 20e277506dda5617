"""llm-gateway as a mitmproxy script: ``mitmdump -s addons/llm_gateway.py``.

For development only. The settings are the gateway's own (VENICE_API_KEY, VENICE_BASE_URL,
DATABASE_URL, ..., or ``--set llm_gateway_config=FILE``). In production run
``llm-gateway sidecar``: it adds the same addon object to its own mitmproxy master, while
a ``-s`` script is hot-reloaded when the file changes, and a file that fails to load
leaves mitmproxy running without the addon, an ordinary proxy.

The addon lives in the package (``llm_gateway.mitm_addon``); this file only hands it to
mitmproxy, the way mitmproxy's own example scripts do.
"""

import os
import sys


def _addon_class() -> type:
    # mitmproxy puts this file's directory first on sys.path while it loads the script,
    # where this very file would shadow the llm_gateway package of the same name. The
    # checkout's root goes last, so a checkout works without installing the package.
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.append(os.path.dirname(here))
    try:
        from llm_gateway.mitm_addon import LlmGateway
    finally:
        sys.path[:] = saved
    return LlmGateway


addons = [_addon_class()()]
