"""One versioned migration history for every store.

Each migration has the SQL for each dialect; a store applies, in order, the versions it
has not recorded in ``schema_migrations``. The schema itself enforces what the data must
never be (prefix length, hash length, positive limits, a revoked key is inactive).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sqlite: str
    postgres: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "gateway keys and usage records",
        sqlite="""
        CREATE TABLE gateway_keys (
            id TEXT PRIMARY KEY CHECK (length(id) = 36),
            subject_id TEXT NOT NULL CHECK (length(subject_id) > 0),
            name TEXT NOT NULL CHECK (length(name) > 0),
            prefix TEXT NOT NULL UNIQUE CHECK (length(prefix) = 12),
            key_hash BLOB NOT NULL UNIQUE
                CHECK (typeof(key_hash) = 'blob' AND length(key_hash) = 32),
            is_active INTEGER NOT NULL DEFAULT 1 CHECK (is_active IN (0, 1)),
            revoked_at REAL,
            expires_at REAL,
            created_at REAL NOT NULL,
            last_used_at REAL,
            rate_limit_requests INTEGER NOT NULL DEFAULT 60 CHECK (rate_limit_requests > 0),
            rate_limit_window_seconds INTEGER NOT NULL DEFAULT 60
                CHECK (rate_limit_window_seconds > 0),
            allowed_models TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(allowed_models)),
            CHECK (revoked_at IS NULL OR is_active = 0)
        );
        CREATE TABLE usage_records (
            request_id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL REFERENCES gateway_keys(id),
            subject_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT,
            upstream TEXT NOT NULL,
            stream INTEGER NOT NULL CHECK (stream IN (0, 1)),
            status INTEGER NOT NULL,
            error_type TEXT,
            prompt_tokens INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
            completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
            total_tokens INTEGER NOT NULL DEFAULT 0 CHECK (total_tokens >= 0),
            cost_usd REAL,
            cost_diem REAL,
            response_id TEXT,
            finish_reasons TEXT NOT NULL DEFAULT '[]',
            started_at REAL NOT NULL,
            duration_ms REAL NOT NULL,
            ttfb_ms REAL,
            first_chunk_ms REAL,
            max_gap_ms REAL,
            attempts INTEGER NOT NULL DEFAULT 1
        );
        CREATE INDEX usage_records_key_started ON usage_records (key_id, started_at);
        """,
        postgres="""
        CREATE TABLE gateway_keys (
            id UUID PRIMARY KEY,
            subject_id TEXT NOT NULL CHECK (length(subject_id) > 0),
            name TEXT NOT NULL CHECK (length(name) > 0),
            prefix TEXT NOT NULL UNIQUE CHECK (length(prefix) = 12),
            key_hash BYTEA NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
            is_active BOOLEAN NOT NULL DEFAULT TRUE,
            revoked_at TIMESTAMPTZ,
            expires_at TIMESTAMPTZ,
            created_at TIMESTAMPTZ NOT NULL,
            last_used_at TIMESTAMPTZ,
            rate_limit_requests INTEGER NOT NULL DEFAULT 60 CHECK (rate_limit_requests > 0),
            rate_limit_window_seconds INTEGER NOT NULL DEFAULT 60
                CHECK (rate_limit_window_seconds > 0),
            allowed_models TEXT[] NOT NULL DEFAULT '{}',
            CHECK (revoked_at IS NULL OR NOT is_active)
        );
        CREATE TABLE usage_records (
            request_id TEXT PRIMARY KEY,
            key_id UUID NOT NULL REFERENCES gateway_keys(id),
            subject_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT,
            upstream TEXT NOT NULL,
            stream BOOLEAN NOT NULL,
            status INTEGER NOT NULL,
            error_type TEXT,
            prompt_tokens INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
            completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
            total_tokens INTEGER NOT NULL DEFAULT 0 CHECK (total_tokens >= 0),
            cost_usd DOUBLE PRECISION,
            cost_diem DOUBLE PRECISION,
            response_id TEXT,
            finish_reasons TEXT[] NOT NULL DEFAULT '{}',
            started_at TIMESTAMPTZ NOT NULL,
            duration_ms DOUBLE PRECISION NOT NULL,
            ttfb_ms DOUBLE PRECISION,
            first_chunk_ms DOUBLE PRECISION,
            max_gap_ms DOUBLE PRECISION,
            attempts INTEGER NOT NULL DEFAULT 1
        );
        CREATE INDEX usage_records_key_started ON usage_records (key_id, started_at);
        """,
    ),
    Migration(
        2,
        "rate-limit windows shared by replicas",
        # One row per (key, limit setting): the current epoch-aligned window and how many
        # requests it admitted. Bounded by the number of keys, so nothing needs sweeping.
        # SQLite gets the same table to keep one history; its gateways count in process.
        sqlite="""
        CREATE TABLE rate_limit_windows (
            bucket TEXT PRIMARY KEY,
            window_start REAL NOT NULL,
            request_count INTEGER NOT NULL CHECK (request_count > 0)
        );
        """,
        postgres="""
        CREATE TABLE rate_limit_windows (
            bucket TEXT PRIMARY KEY,
            window_start TIMESTAMPTZ NOT NULL,
            request_count INTEGER NOT NULL CHECK (request_count > 0)
        );
        """,
    ),
)
