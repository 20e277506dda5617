"""llm-gateway as a mitmproxy script: ``mitmdump -s addons/gateway_addon.py``.

For development only. The settings are the gateway's own (VENICE_API_KEY, VENICE_BASE_URL,
DATABASE_URL, ..., or ``--set llm_gateway_config=FILE``). In production run
``llm-gateway sidecar``: it adds the same addon object to its own mitmproxy master, while
a ``-s`` script is hot-reloaded when the file changes, and a file that fails to load
leaves mitmproxy running without the addon, an ordinary proxy.

The addon lives in the package (``llm_gateway.adapters.mitm_addon``); this file only
hands it to mitmproxy, the way mitmproxy's own example scripts do. Its name is not the
package's, so the checkout's root may simply follow it on ``sys.path``.
"""

import os
import sys

# A checkout works without installing the package.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llm_gateway.adapters.mitm_addon import GatewayAddon

addons = [GatewayAddon()]
