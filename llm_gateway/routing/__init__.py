"""Where a request goes: the upstream client (and, with routing, aliases, target selection
and passive health)."""
