"""Who owns each Responses API id: the subject (and key) that created it, and the provider
and upstream model that did, shared by every replica.

The providers behind the gateway hold one provider key for every caller, so they cannot
keep callers' stored responses apart: the gateway does. It binds each response id it
relays to its creator; a GET, DELETE, cancel, input_items or ``previous_response_id``
naming an id bound to someone else is answered as the provider answers an unknown id,
and a follow-up goes to the target that created the id. The binding lives where the
gateway's other shared state does (Redis when REDIS_URL is set, else the key store's
database: llm_gateway.stores.responses_redis, _postgres, _sqlite), so every replica
agrees, and expires after RESPONSES_RETENTION_DAYS; ``wiring.open_response_owners``
chooses. The key store is always SQLite or Postgres (``open_store``), so there is no
in-memory variant: a single process on SQLite keeps its bindings in its own database,
which also survives a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DAY_SECONDS = 86_400.0
# The SQL stores delete expired rows themselves: every SWEEP_EVERY_BINDS binds, at most
# SWEEP_ROWS of them, so no bind waits on a large delete. One bind adds one row, so a
# sweep removes up to five times what was added since the last: the table keeps up.
SWEEP_EVERY_BINDS = 100
SWEEP_ROWS = 500


@dataclass(frozen=True, slots=True)
class ResponseBinding:
    response_id: str
    subject_id: str
    key_id: str | None  # None for a JWT caller, which has no gateway key
    provider: str  # the route table's provider name that created it
    model: str  # that target's upstream model
    created_at: float  # Unix seconds
    expires_at: float

    @classmethod
    def new(cls, response_id: str, subject_id: str, key_id: str | None, provider: str,
            model: str, *, now: float, retention_days: int) -> ResponseBinding:
        """A binding made ``now`` that lasts RESPONSES_RETENTION_DAYS."""
        return cls(response_id, subject_id, key_id, provider, model, created_at=now,
                   expires_at=now + retention_days * DAY_SECONDS)


class ResponseOwners(Protocol):
    backend: str

    async def bind(self, binding: ResponseBinding) -> None:
        """Record ``binding``. Idempotent; a live binding of the same id is kept (the
        first bind wins), an expired one is replaced. Raises StoreUnavailable when the
        store does not answer."""
        ...

    async def owner(self, response_id: str) -> ResponseBinding | None:
        """The id's binding; None when unknown or expired. Raises StoreUnavailable when
        the store does not answer (the caller answers 503, never "not found")."""
        ...

    async def forget(self, response_id: str) -> None:
        """Drop the id's binding (after the provider deleted the response)."""
        ...

    async def close(self) -> None: ...

