"""The admin service: everything an operator does, shared by the CLI and the admin API.

One ``AdminService`` per actor (an admin token's name, or ``cli``). Each operation checks
its rules here, once, and every change it makes writes one audit event in the store's
transaction: who, what, to what, the changed fields before and after (secrets masked),
and when. The operations are grouped by aggregate in the ``service_*`` modules.
"""

from __future__ import annotations

from llm_gateway.admin.common import (
    AdminError,
    Conflict,
    Invalid,
    NotConfigured,
    NotFound,
    key_fields,
    key_state,
)
from llm_gateway.admin.service_access import (
    AccessOps,
    event_fields,
    token_fields,
    verify_admin_token,
)
from llm_gateway.admin.service_billing import (
    OPTIONAL_RATES,
    BillingOps,
    budget_fields,
    parse_money,
    price_fields,
)
from llm_gateway.admin.service_keys import KeyOps
from llm_gateway.admin.service_routes import RouteOps

CLI_ACTOR = "cli"


class AdminService(KeyOps, BillingOps, RouteOps, AccessOps):
    """Keys, subjects, budgets, prices, usage, routes, provider keys, admin tokens and
    the audit log (see each mixin)."""


__all__ = [
    "CLI_ACTOR", "OPTIONAL_RATES", "AdminError", "AdminService", "Conflict", "Invalid",
    "NotConfigured", "NotFound", "budget_fields", "event_fields", "key_fields", "key_state",
    "parse_money", "price_fields", "token_fields", "verify_admin_token",
]
