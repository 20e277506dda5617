"""One versioned migration history for every store. Its size is the concept: the
schema's whole history, one entry per version, never edited once released.

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
    Migration(
        3,
        "admin plane: prices, budgets, admin tokens, audit events, provider keys, routes",
        # Money is exact: NUMERIC in Postgres, a decimal string in SQLite (never REAL).
        # A budget's NULL means "no limit of that kind". Admin token names are unique
        # among live tokens: the audit log names its actors by them.
        sqlite="""
        CREATE TABLE prices (
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL CHECK (length(model) > 0),
            input_per_mtok TEXT NOT NULL,
            output_per_mtok TEXT NOT NULL,
            cached_input_per_mtok TEXT,
            effective_from REAL NOT NULL,
            PRIMARY KEY (provider, model, effective_from)
        );
        CREATE TABLE budgets (
            scope TEXT NOT NULL CHECK (scope IN ('key', 'subject')),
            scope_id TEXT NOT NULL CHECK (length(scope_id) > 0),
            daily_usd TEXT,
            monthly_usd TEXT,
            daily_tokens INTEGER CHECK (daily_tokens >= 0),
            monthly_tokens INTEGER CHECK (monthly_tokens >= 0),
            tokens_per_minute INTEGER CHECK (tokens_per_minute > 0),
            max_output_tokens INTEGER CHECK (max_output_tokens > 0),
            over_cap TEXT NOT NULL DEFAULT 'clamp' CHECK (over_cap IN ('clamp', 'reject')),
            stop_streams_at_budget INTEGER NOT NULL DEFAULT 0
                CHECK (stop_streams_at_budget IN (0, 1)),
            PRIMARY KEY (scope, scope_id)
        );
        CREATE TABLE admin_tokens (
            id TEXT PRIMARY KEY CHECK (length(id) = 36),
            name TEXT NOT NULL CHECK (length(name) > 0),
            prefix TEXT NOT NULL UNIQUE CHECK (length(prefix) = 13),
            token_hash BLOB NOT NULL UNIQUE
                CHECK (typeof(token_hash) = 'blob' AND length(token_hash) = 32),
            created_at REAL NOT NULL,
            revoked_at REAL,
            last_used_at REAL
        );
        CREATE UNIQUE INDEX admin_tokens_live_name ON admin_tokens (name)
            WHERE revoked_at IS NULL;
        CREATE TABLE audit_events (
            id TEXT PRIMARY KEY,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            before TEXT CHECK (before IS NULL OR json_valid(before)),
            after TEXT CHECK (after IS NULL OR json_valid(after))
        );
        CREATE INDEX audit_events_at ON audit_events (at);
        CREATE TABLE provider_keys (
            name TEXT PRIMARY KEY CHECK (length(name) > 0),
            nonce BLOB NOT NULL CHECK (length(nonce) = 12),
            ciphertext BLOB NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE route_versions (
            version INTEGER PRIMARY KEY CHECK (version > 0),
            document TEXT NOT NULL CHECK (json_valid(document)),
            created_by TEXT NOT NULL,
            created_at REAL NOT NULL,
            note TEXT NOT NULL DEFAULT ''
        );
        """,
        postgres="""
        CREATE TABLE prices (
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL CHECK (length(model) > 0),
            input_per_mtok NUMERIC NOT NULL CHECK (input_per_mtok >= 0),
            output_per_mtok NUMERIC NOT NULL CHECK (output_per_mtok >= 0),
            cached_input_per_mtok NUMERIC CHECK (cached_input_per_mtok >= 0),
            effective_from TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (provider, model, effective_from)
        );
        CREATE TABLE budgets (
            scope TEXT NOT NULL CHECK (scope IN ('key', 'subject')),
            scope_id TEXT NOT NULL CHECK (length(scope_id) > 0),
            daily_usd NUMERIC CHECK (daily_usd >= 0),
            monthly_usd NUMERIC CHECK (monthly_usd >= 0),
            daily_tokens BIGINT CHECK (daily_tokens >= 0),
            monthly_tokens BIGINT CHECK (monthly_tokens >= 0),
            tokens_per_minute BIGINT CHECK (tokens_per_minute > 0),
            max_output_tokens INTEGER CHECK (max_output_tokens > 0),
            over_cap TEXT NOT NULL DEFAULT 'clamp' CHECK (over_cap IN ('clamp', 'reject')),
            stop_streams_at_budget BOOLEAN NOT NULL DEFAULT FALSE,
            PRIMARY KEY (scope, scope_id)
        );
        CREATE TABLE admin_tokens (
            id UUID PRIMARY KEY,
            name TEXT NOT NULL CHECK (length(name) > 0),
            prefix TEXT NOT NULL UNIQUE CHECK (length(prefix) = 13),
            token_hash BYTEA NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
            created_at TIMESTAMPTZ NOT NULL,
            revoked_at TIMESTAMPTZ,
            last_used_at TIMESTAMPTZ
        );
        CREATE UNIQUE INDEX admin_tokens_live_name ON admin_tokens (name)
            WHERE revoked_at IS NULL;
        CREATE TABLE audit_events (
            id UUID PRIMARY KEY,
            at TIMESTAMPTZ NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            before JSONB,
            after JSONB
        );
        CREATE INDEX audit_events_at ON audit_events (at);
        CREATE TABLE provider_keys (
            name TEXT PRIMARY KEY CHECK (length(name) > 0),
            nonce BYTEA NOT NULL CHECK (octet_length(nonce) = 12),
            ciphertext BYTEA NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE route_versions (
            version INTEGER PRIMARY KEY CHECK (version > 0),
            document JSONB NOT NULL,
            created_by TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            note TEXT NOT NULL DEFAULT ''
        );
        """,
    ),
    Migration(
        4,
        "usage records v2: provider and upstream model, exact money, partitioned by day",
        # The requested model and the one that answered are kept apart; key_id has no
        # foreign key (a log outlives keys, and JWT callers have none). Money is exact:
        # NUMERIC in Postgres; in SQLite an INTEGER count of 1e-10 USD, so SUM() is exact
        # too. Postgres partitions by day (the writer creates partitions ahead; retention
        # drops whole ones); the primary key includes the partition key, and a replayed
        # record has the same (request_id, started_at), so a replay never doubles a row.
        sqlite="""
        ALTER TABLE usage_records RENAME TO usage_records_v1;
        CREATE TABLE usage_records (
            request_id TEXT PRIMARY KEY,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            key_id TEXT,
            key_prefix TEXT NOT NULL DEFAULT '',
            subject_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT,
            provider TEXT NOT NULL DEFAULT '',
            upstream_model TEXT,
            stream INTEGER NOT NULL CHECK (stream IN (0, 1)),
            status INTEGER NOT NULL,
            error_code TEXT,
            error_message TEXT,
            prompt_tokens INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
            completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
            total_tokens INTEGER NOT NULL DEFAULT 0 CHECK (total_tokens >= 0),
            cached_tokens INTEGER NOT NULL DEFAULT 0 CHECK (cached_tokens >= 0),
            tokens_estimated INTEGER NOT NULL DEFAULT 0 CHECK (tokens_estimated IN (0, 1)),
            cost_usd INTEGER,
            provider_cost_usd INTEGER,
            provider_cost_diem INTEGER,
            duration_ms REAL NOT NULL,
            ttfb_ms REAL,
            first_chunk_ms REAL,
            max_gap_ms REAL,
            attempts INTEGER NOT NULL DEFAULT 1,
            response_id TEXT,
            finish_reasons TEXT NOT NULL DEFAULT '[]',
            trace_id TEXT
        );
        INSERT INTO usage_records (
            request_id, started_at, ended_at, key_id, subject_id, adapter, endpoint, model,
            provider, upstream_model, stream, status, error_code, prompt_tokens,
            completion_tokens, total_tokens, provider_cost_usd, provider_cost_diem,
            duration_ms, ttfb_ms, first_chunk_ms, max_gap_ms, attempts, response_id,
            finish_reasons)
        SELECT request_id, started_at, started_at + duration_ms / 1000.0, key_id, subject_id,
            adapter, endpoint, model, upstream, model, stream, status, error_type,
            prompt_tokens, completion_tokens, total_tokens,
            CAST(round(cost_usd * 10000000000) AS INTEGER),
            CAST(round(cost_diem * 10000000000) AS INTEGER),
            duration_ms, ttfb_ms, first_chunk_ms, max_gap_ms, attempts, response_id,
            finish_reasons
        FROM usage_records_v1;
        DROP TABLE usage_records_v1;
        CREATE INDEX usage_records_started ON usage_records (started_at);
        CREATE INDEX usage_records_key_started ON usage_records (key_id, started_at);
        CREATE INDEX usage_records_subject_started ON usage_records (subject_id, started_at);
        """,
        postgres="""
        ALTER TABLE usage_records RENAME TO usage_records_v1;
        ALTER INDEX usage_records_key_started RENAME TO usage_records_v1_key_started;
        ALTER TABLE usage_records_v1 RENAME CONSTRAINT usage_records_pkey
            TO usage_records_v1_pkey;
        CREATE TABLE usage_records (
            request_id TEXT NOT NULL,
            started_at TIMESTAMPTZ NOT NULL,
            ended_at TIMESTAMPTZ NOT NULL,
            key_id TEXT,
            key_prefix TEXT NOT NULL DEFAULT '',
            subject_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT,
            provider TEXT NOT NULL DEFAULT '',
            upstream_model TEXT,
            stream BOOLEAN NOT NULL,
            status INTEGER NOT NULL,
            error_code TEXT,
            error_message TEXT,
            prompt_tokens INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
            completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
            total_tokens INTEGER NOT NULL DEFAULT 0 CHECK (total_tokens >= 0),
            cached_tokens INTEGER NOT NULL DEFAULT 0 CHECK (cached_tokens >= 0),
            tokens_estimated BOOLEAN NOT NULL DEFAULT FALSE,
            cost_usd NUMERIC(24, 10),
            provider_cost_usd NUMERIC(24, 10),
            provider_cost_diem NUMERIC(24, 10),
            duration_ms DOUBLE PRECISION NOT NULL,
            ttfb_ms DOUBLE PRECISION,
            first_chunk_ms DOUBLE PRECISION,
            max_gap_ms DOUBLE PRECISION,
            attempts INTEGER NOT NULL DEFAULT 1,
            response_id TEXT,
            finish_reasons TEXT[] NOT NULL DEFAULT '{}',
            trace_id TEXT,
            PRIMARY KEY (request_id, started_at)
        ) PARTITION BY RANGE (started_at);
        CREATE INDEX usage_records_started ON usage_records (started_at);
        CREATE INDEX usage_records_key_started ON usage_records (key_id, started_at);
        CREATE INDEX usage_records_subject_started ON usage_records (subject_id, started_at);
        DO $$
        DECLARE day date;
        BEGIN
            FOR day IN SELECT DISTINCT (started_at AT TIME ZONE 'UTC')::date
                       FROM usage_records_v1 LOOP
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF usage_records FOR VALUES FROM (%L) TO (%L)',
                    'usage_records_p' || to_char(day, 'YYYYMMDD'),
                    day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            END LOOP;
        END $$;
        INSERT INTO usage_records (
            request_id, started_at, ended_at, key_id, subject_id, adapter, endpoint, model,
            provider, upstream_model, stream, status, error_code, prompt_tokens,
            completion_tokens, total_tokens, provider_cost_usd, provider_cost_diem,
            duration_ms, ttfb_ms, first_chunk_ms, max_gap_ms, attempts, response_id,
            finish_reasons)
        SELECT request_id, started_at,
            started_at + duration_ms * interval '1 millisecond', key_id::text, subject_id,
            adapter, endpoint, model, upstream, model, stream, status, error_type,
            prompt_tokens, completion_tokens, total_tokens, cost_usd::numeric,
            cost_diem::numeric, duration_ms, ttfb_ms, first_chunk_ms, max_gap_ms, attempts,
            response_id, finish_reasons
        FROM usage_records_v1;
        DROP TABLE usage_records_v1;
        """,
    ),
    Migration(
        5,
        "the budget ledger: counters reserved against, token buckets",
        # spent and reserved are whole units (1e-10 USD, or tokens). Postgres reserves and
        # settles through two functions, one statement each; SQLite keeps the tables for
        # gateways that share a SQLite file between processes.
        sqlite="""
        CREATE TABLE quota_counters (
            name TEXT PRIMARY KEY,
            spent INTEGER NOT NULL DEFAULT 0,
            reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
            expires_at REAL NOT NULL
        );
        CREATE TABLE quota_buckets (
            name TEXT PRIMARY KEY,
            level REAL NOT NULL,
            at REAL NOT NULL
        );
        """,
        postgres="""
        CREATE TABLE quota_counters (
            name TEXT PRIMARY KEY,
            spent BIGINT NOT NULL DEFAULT 0,
            reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
            expires_at TIMESTAMPTZ NOT NULL
        );
        CREATE INDEX quota_counters_expires ON quota_counters (expires_at);
        CREATE TABLE quota_buckets (
            name TEXT PRIMARY KEY,
            level DOUBLE PRECISION NOT NULL,
            at TIMESTAMPTZ NOT NULL
        );
        CREATE FUNCTION llmg_reserve(
            names TEXT[], limits BIGINT[], amounts BIGINT[], expires TIMESTAMPTZ[],
            buckets TEXT[], capacities BIGINT[], draws BIGINT[],
            OUT granted BOOLEAN, OUT refused TEXT, OUT lefts BIGINT[]
        ) LANGUAGE plpgsql AS $$
        DECLARE
            i INTEGER;
            s BIGINT;
            r BIGINT;
            lvl DOUBLE PRECISION;
            levels DOUBLE PRECISION[] := '{}';
            now_ TIMESTAMPTZ := clock_timestamp();
        BEGIN
            granted := FALSE;
            lefts := '{}';
            INSERT INTO quota_counters (name, expires_at)
                SELECT * FROM unnest(names, expires) ON CONFLICT (name) DO NOTHING;
            INSERT INTO quota_buckets (name, level, at)
                SELECT b.name, b.capacity, now_
                FROM unnest(buckets, capacities) AS b(name, capacity)
                ON CONFLICT (name) DO NOTHING;
            PERFORM 1 FROM quota_counters WHERE name = ANY(names) ORDER BY name FOR UPDATE;
            PERFORM 1 FROM quota_buckets WHERE name = ANY(buckets) ORDER BY name FOR UPDATE;
            FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
                SELECT spent, reserved INTO s, r FROM quota_counters WHERE name = names[i];
                lefts := lefts || (limits[i] - s - r);
                IF refused IS NULL AND s + r + amounts[i] > limits[i] THEN
                    refused := names[i];
                END IF;
            END LOOP;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                SELECT least(capacities[i]::double precision, level
                             + extract(epoch FROM now_ - at) * capacities[i] / 60.0)
                    INTO lvl FROM quota_buckets WHERE name = buckets[i];
                levels := levels || lvl;
                lefts := lefts || floor(lvl)::BIGINT;
                IF refused IS NULL AND lvl < draws[i] THEN
                    refused := buckets[i];
                END IF;
            END LOOP;
            IF refused IS NOT NULL THEN
                RETURN;
            END IF;
            UPDATE quota_counters c SET reserved = c.reserved + a.amount,
                                        expires_at = greatest(c.expires_at, a.expires)
                FROM unnest(names, amounts, expires) AS a(name, amount, expires)
                WHERE c.name = a.name;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                UPDATE quota_buckets SET level = levels[i] - draws[i], at = now_
                    WHERE name = buckets[i];
            END LOOP;
            granted := TRUE;
        END $$;
        CREATE FUNCTION llmg_settle(
            names TEXT[], held BIGINT[], spent BIGINT[], expires TIMESTAMPTZ[],
            buckets TEXT[], capacities BIGINT[], drawn BIGINT[], used BIGINT[]
        ) RETURNS VOID LANGUAGE plpgsql AS $$
        DECLARE
            i INTEGER;
            now_ TIMESTAMPTZ := clock_timestamp();
        BEGIN
            INSERT INTO quota_counters (name, expires_at)
                SELECT * FROM unnest(names, expires) ON CONFLICT (name) DO NOTHING;
            UPDATE quota_counters c
                SET reserved = greatest(0, c.reserved - a.held), spent = c.spent + a.spent
                FROM unnest(names, held, spent) AS a(name, held, spent)
                WHERE c.name = a.name;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                UPDATE quota_buckets SET
                    level = least(capacities[i]::double precision, level
                                  + extract(epoch FROM now_ - at) * capacities[i] / 60.0
                                  + drawn[i] - used[i]),
                    at = now_
                    WHERE name = buckets[i];
            END LOOP;
        END $$;
        """,
    ),
    Migration(
        6,
        "llmg_settle that runs: its parameters no longer clash with the columns it updates",
        # Migration 5's llmg_settle named unnest's columns after its own parameters, which
        # Postgres refuses at the first call: reservations were never released and spend
        # never booked. Same signature, so callers are unchanged.
        sqlite="SELECT 1;",
        postgres="""
        CREATE OR REPLACE FUNCTION llmg_settle(
            names TEXT[], held BIGINT[], spent BIGINT[], expires TIMESTAMPTZ[],
            buckets TEXT[], capacities BIGINT[], drawn BIGINT[], used BIGINT[]
        ) RETURNS VOID LANGUAGE plpgsql AS $$
        DECLARE
            i INTEGER;
            now_ TIMESTAMPTZ := clock_timestamp();
        BEGIN
            INSERT INTO quota_counters (name, expires_at)
                SELECT * FROM unnest(names, expires) ON CONFLICT (name) DO NOTHING;
            UPDATE quota_counters c
                SET reserved = greatest(0, c.reserved - a.held_now), spent = c.spent + a.spent_now
                FROM unnest(llmg_settle.names, llmg_settle.held, llmg_settle.spent)
                    AS a(counter, held_now, spent_now)
                WHERE c.name = a.counter;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                UPDATE quota_buckets SET
                    level = least(capacities[i]::double precision, level
                                  + extract(epoch FROM now_ - at) * capacities[i] / 60.0
                                  + drawn[i] - used[i]),
                    at = now_
                    WHERE name = buckets[i];
            END LOOP;
        END $$;
        """,
    ),
    Migration(
        7,
        "the budget ledger's owners: held rows, tombstones, processes, and the sweep",
        # A reservation may name its owner (a process, one of its requests): it is then
        # also a held row, settled exactly once, and released by llmg_sweep when its
        # process is not heard of any more (llm_gateway.billing.ledger). A held row
        # references its process, so no sweep forgets a process that holds one. New
        # overloads take the owner (NULL: as before); the old ones stay for replicas of
        # the previous version during a rolling upgrade. Every function locks a process
        # before any counter, and counters in name order: no two of them deadlock.
        # SQLite keeps these tables in the workers' file (llm_gateway.limits.sqlite).
        sqlite="SELECT 1;",
        postgres="""
        CREATE TABLE quota_processes (
            process TEXT PRIMARY KEY,
            heard_at TIMESTAMPTZ NOT NULL
        );
        CREATE INDEX quota_processes_heard ON quota_processes (heard_at);
        CREATE TABLE quota_held (
            process TEXT NOT NULL REFERENCES quota_processes (process),
            request TEXT NOT NULL,
            counters TEXT[] NOT NULL,
            units BIGINT[] NOT NULL,
            PRIMARY KEY (process, request)
        );
        CREATE TABLE quota_swept (
            process TEXT NOT NULL,
            request TEXT NOT NULL,
            swept_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (process, request)
        );
        CREATE INDEX quota_swept_at ON quota_swept (swept_at);
        CREATE FUNCTION llmg_reserve(
            names TEXT[], limits BIGINT[], amounts BIGINT[], expires TIMESTAMPTZ[],
            buckets TEXT[], capacities BIGINT[], draws BIGINT[],
            owner_process TEXT, owner_request TEXT,
            OUT granted BOOLEAN, OUT refused TEXT, OUT lefts BIGINT[]
        ) LANGUAGE plpgsql AS $$
        DECLARE
            i INTEGER;
            s BIGINT;
            r BIGINT;
            lvl DOUBLE PRECISION;
            levels DOUBLE PRECISION[] := '{}';
            now_ TIMESTAMPTZ := clock_timestamp();
        BEGIN
            granted := FALSE;
            lefts := '{}';
            IF owner_process IS NOT NULL THEN
                -- The process row, before any counter (as the sweep takes them). Heard of
                -- within the second: only key-share locked, so that no sweep forgets it
                -- meanwhile and the reservations of one process do not queue on it.
                PERFORM 1 FROM quota_processes p WHERE p.process = owner_process
                    AND p.heard_at > now_ - interval '1 second' FOR KEY SHARE;
                IF NOT FOUND THEN
                    INSERT INTO quota_processes AS p (process, heard_at)
                        VALUES (owner_process, now_)
                        ON CONFLICT (process) DO UPDATE
                        SET heard_at = greatest(p.heard_at, EXCLUDED.heard_at);
                END IF;
            END IF;
            INSERT INTO quota_counters (name, expires_at)
                SELECT * FROM unnest(names, expires) ON CONFLICT (name) DO NOTHING;
            INSERT INTO quota_buckets (name, level, at)
                SELECT b.name, b.capacity, now_
                FROM unnest(buckets, capacities) AS b(name, capacity)
                ON CONFLICT (name) DO NOTHING;
            PERFORM 1 FROM quota_counters WHERE name = ANY(names) ORDER BY name FOR UPDATE;
            PERFORM 1 FROM quota_buckets WHERE name = ANY(buckets) ORDER BY name FOR UPDATE;
            FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
                SELECT spent, reserved INTO s, r FROM quota_counters WHERE name = names[i];
                lefts := lefts || (limits[i] - s - r);
                IF refused IS NULL AND s + r + amounts[i] > limits[i] THEN
                    refused := names[i];
                END IF;
            END LOOP;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                SELECT least(capacities[i]::double precision, level
                             + extract(epoch FROM now_ - at) * capacities[i] / 60.0)
                    INTO lvl FROM quota_buckets WHERE name = buckets[i];
                levels := levels || lvl;
                lefts := lefts || floor(lvl)::BIGINT;
                IF refused IS NULL AND lvl < draws[i] THEN
                    refused := buckets[i];
                END IF;
            END LOOP;
            IF refused IS NOT NULL THEN
                RETURN;
            END IF;
            UPDATE quota_counters c SET reserved = c.reserved + a.amount,
                                        expires_at = greatest(c.expires_at, a.expires)
                FROM unnest(names, amounts, expires) AS a(name, amount, expires)
                WHERE c.name = a.name;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                UPDATE quota_buckets SET level = levels[i] - draws[i], at = now_
                    WHERE name = buckets[i];
            END LOOP;
            IF owner_process IS NOT NULL AND coalesce(array_length(names, 1), 0) > 0 THEN
                -- A second reservation of one owner joins its row.
                INSERT INTO quota_held AS h (process, request, counters, units)
                    VALUES (owner_process, owner_request, names, amounts)
                    ON CONFLICT (process, request) DO UPDATE
                    SET counters = h.counters || EXCLUDED.counters,
                        units = h.units || EXCLUDED.units;
            END IF;
            granted := TRUE;
        END $$;
        CREATE FUNCTION llmg_settle(
            names TEXT[], held BIGINT[], spent BIGINT[], expires TIMESTAMPTZ[],
            buckets TEXT[], capacities BIGINT[], drawn BIGINT[], used BIGINT[],
            owner_process TEXT, owner_request TEXT
        ) RETURNS VOID LANGUAGE plpgsql AS $$
        DECLARE
            i INTEGER;
            now_ TIMESTAMPTZ := clock_timestamp();
            -- What is released: the holds, or with an owner what its row holds.
            released_names TEXT[] := llmg_settle.names;
            released_units BIGINT[] := llmg_settle.held;
            booked BOOLEAN := TRUE;
        BEGIN
            IF owner_process IS NOT NULL THEN
                -- Exactly once: the row (or else the tombstone) is deleted by one
                -- settlement or sweep only; each statement sees what the one before
                -- it waited for.
                DELETE FROM quota_held h
                    WHERE h.process = owner_process AND h.request = owner_request
                    RETURNING h.counters, h.units INTO released_names, released_units;
                IF NOT FOUND THEN
                    released_names := '{}';
                    released_units := '{}';
                    DELETE FROM quota_swept w
                        WHERE w.process = owner_process AND w.request = owner_request;
                    booked := FOUND;
                END IF;
            END IF;
            IF booked THEN
                INSERT INTO quota_counters (name, expires_at)
                    SELECT * FROM unnest(llmg_settle.names, llmg_settle.expires)
                    ON CONFLICT (name) DO NOTHING;
            END IF;
            PERFORM 1 FROM quota_counters c
                WHERE c.name = ANY(released_names) OR (booked AND c.name = ANY(llmg_settle.names))
                ORDER BY c.name FOR UPDATE;
            UPDATE quota_counters c
                SET reserved = greatest(0, c.reserved - a.release_now),
                    spent = c.spent + a.book_now
                FROM (SELECT z.counter, sum(z.release_now) AS release_now,
                             sum(z.book_now) AS book_now
                      FROM (SELECT x.counter, x.units AS release_now, 0::BIGINT AS book_now
                            FROM unnest(released_names, released_units) AS x(counter, units)
                            UNION ALL
                            SELECT y.counter, 0::BIGINT, y.units
                            FROM unnest(llmg_settle.names, llmg_settle.spent)
                                AS y(counter, units)
                            WHERE booked) z
                      GROUP BY z.counter) a
                WHERE c.name = a.counter;
            FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
                UPDATE quota_buckets SET
                    level = least(capacities[i]::double precision, level
                                  + extract(epoch FROM now_ - at) * capacities[i] / 60.0
                                  + drawn[i] - used[i]),
                    at = now_
                    WHERE name = buckets[i];
            END LOOP;
        END $$;
        CREATE FUNCTION llmg_sweep(
            orphan_seconds DOUBLE PRECISION, most_processes INTEGER, most_rows INTEGER,
            tombstone_seconds DOUBLE PRECISION
        ) RETURNS INTEGER LANGUAGE plpgsql AS $$
        DECLARE
            now_ TIMESTAMPTZ := clock_timestamp();
            silent TEXT;
            taken INTEGER;
            most INTEGER;
            released INTEGER := 0;
            more_names TEXT[];
            more_units BIGINT[];
            all_names TEXT[] := '{}';
            all_units BIGINT[] := '{}';
        BEGIN
            -- Old tombstones first, before any process or counter is locked.
            DELETE FROM quota_swept w WHERE (w.process, w.request) IN (
                SELECT o.process, o.request FROM quota_swept o
                WHERE o.swept_at < now_ - tombstone_seconds * interval '1 second'
                LIMIT most_rows);
            -- A process another sweep is on is skipped; reservations (key share) are not
            -- held up.
            FOR silent IN SELECT p.process FROM quota_processes p
                    WHERE p.heard_at < now_ - orphan_seconds * interval '1 second'
                    ORDER BY p.heard_at LIMIT most_processes
                    FOR NO KEY UPDATE SKIP LOCKED LOOP
                EXIT WHEN released >= most_rows;
                most := most_rows - released;
                WITH gone AS (
                    DELETE FROM quota_held h
                    WHERE h.process = silent AND h.request IN (
                        SELECT k.request FROM quota_held k WHERE k.process = silent
                        LIMIT most)
                    RETURNING h.request, h.counters, h.units
                ), tombstones AS (
                    INSERT INTO quota_swept (process, request, swept_at)
                    SELECT silent, g.request, now_ FROM gone g
                    ON CONFLICT (process, request) DO NOTHING
                )
                SELECT count(DISTINCT g.request)::INTEGER, array_agg(u.counter),
                       array_agg(u.units)
                    INTO taken, more_names, more_units
                    FROM gone g, unnest(g.counters, g.units) AS u(counter, units);
                released := released + taken;
                all_names := all_names || coalesce(more_names, '{}');
                all_units := all_units || coalesce(more_units, '{}');
                IF taken < most THEN  -- none left: else the next sweep goes on with it
                    BEGIN
                        -- Forgotten once it holds nothing, unless it was heard of again;
                        -- a reservation it made meanwhile keeps it (its row's reference),
                        -- as does one still under way (the next sweep forgets it).
                        DELETE FROM quota_processes p WHERE p.process = silent
                            AND p.heard_at < now_ - orphan_seconds * interval '1 second';
                    EXCEPTION WHEN foreign_key_violation OR lock_not_available THEN
                        NULL;
                    END;
                END IF;
            END LOOP;
            -- Every counter released at once, locked in name order.
            PERFORM 1 FROM quota_counters c WHERE c.name = ANY(all_names)
                ORDER BY c.name FOR UPDATE;
            UPDATE quota_counters c SET reserved = greatest(0, c.reserved - a.units)
                FROM (SELECT x.counter, sum(x.units) AS units
                      FROM unnest(all_names, all_units) AS x(counter, units)
                      GROUP BY x.counter) a
                WHERE c.name = a.counter;
            RETURN released;
        END $$;
        """,
    ),
    Migration(
        8,
        "usage records by protocol, with cache reads, cache writes and reasoning; prices of "
        "cache writes",
        # cached_tokens becomes cache_read_tokens, beside the tokens written to the cache
        # (of them, those kept for an hour) and those spent reasoning. On Postgres every
        # ALTER of the partitioned table reaches each day's partition, and partitions made
        # later copy the parent; the new CHECKs are NOT VALID there because every existing
        # row holds the default 0, which meets them, so no scan of the whole usage history
        # runs under the table's exclusive lock (they hold for every row written after).
        # A price's cache-write rates: NULL means the input rate (for 1-hour writes, the
        # 5-minute rate if there is one).
        sqlite="""
        ALTER TABLE usage_records RENAME COLUMN cached_tokens TO cache_read_tokens;
        ALTER TABLE usage_records ADD COLUMN protocol TEXT NOT NULL DEFAULT '';
        ALTER TABLE usage_records ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0
            CHECK (cache_write_tokens >= 0);
        ALTER TABLE usage_records ADD COLUMN cache_write_1h_tokens INTEGER NOT NULL DEFAULT 0
            CHECK (cache_write_1h_tokens >= 0);
        ALTER TABLE usage_records ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0
            CHECK (reasoning_tokens >= 0);
        ALTER TABLE prices ADD COLUMN cache_write_per_mtok TEXT;
        ALTER TABLE prices ADD COLUMN cache_write_1h_per_mtok TEXT;
        """,
        postgres="""
        ALTER TABLE usage_records RENAME COLUMN cached_tokens TO cache_read_tokens;
        ALTER TABLE usage_records RENAME CONSTRAINT usage_records_cached_tokens_check
            TO usage_records_cache_read_tokens_check;
        ALTER TABLE usage_records
            ADD COLUMN protocol TEXT NOT NULL DEFAULT '',
            ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN cache_write_1h_tokens INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0,
            ADD CONSTRAINT usage_records_cache_write_tokens_check
                CHECK (cache_write_tokens >= 0) NOT VALID,
            ADD CONSTRAINT usage_records_cache_write_1h_tokens_check
                CHECK (cache_write_1h_tokens >= 0) NOT VALID,
            ADD CONSTRAINT usage_records_reasoning_tokens_check
                CHECK (reasoning_tokens >= 0) NOT VALID;
        ALTER TABLE prices
            ADD COLUMN cache_write_per_mtok NUMERIC CHECK (cache_write_per_mtok >= 0),
            ADD COLUMN cache_write_1h_per_mtok NUMERIC CHECK (cache_write_1h_per_mtok >= 0);
        """,
    ),
    Migration(
        9,
        "response owners: who created each Responses API id, where, until when",
        # The providers hold one key for every caller, so the gateway keeps stored
        # responses apart (llm_gateway.stores.responses): one row per response id, kept
        # until expires_at (RESPONSES_RETENTION_DAYS), swept by its index. key_id has no
        # foreign key: JWT callers have no key, and a binding may outlive its key's row.
        sqlite="""
        CREATE TABLE response_owners (
            response_id TEXT PRIMARY KEY CHECK (length(response_id) > 0),
            subject_id TEXT NOT NULL CHECK (length(subject_id) > 0),
            key_id TEXT,
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL CHECK (expires_at >= created_at)
        );
        CREATE INDEX response_owners_expires ON response_owners (expires_at);
        """,
        postgres="""
        CREATE TABLE response_owners (
            response_id TEXT PRIMARY KEY CHECK (length(response_id) > 0),
            subject_id TEXT NOT NULL CHECK (length(subject_id) > 0),
            key_id TEXT,
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL CHECK (expires_at >= created_at)
        );
        CREATE INDEX response_owners_expires ON response_owners (expires_at);
        """,
    ),
    Migration(
        10,
        "usage records with the caller's tags and end user; found by trace id",
        # Tags are a JSON object (at most caller_text.MAX_TAGS pairs), grouped by a key in
        # reports; the end user is the body's ``user`` / ``metadata.user_id``. ``usage
        # show`` finds a request by its request id (the primary key's first column) or its
        # trace id, which this indexes. On Postgres the index on the partitioned table is
        # made on every day's partition, and partitions made later get their own.
        sqlite="""
        ALTER TABLE usage_records ADD COLUMN tags TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE usage_records ADD COLUMN end_user TEXT;
        CREATE INDEX usage_records_trace ON usage_records (trace_id);
        """,
        postgres="""
        ALTER TABLE usage_records
            ADD COLUMN tags JSONB NOT NULL DEFAULT '{}',
            ADD COLUMN end_user TEXT;
        CREATE INDEX usage_records_trace ON usage_records (trace_id);
        """,
    ),
    Migration(
        11,
        "prices by source (operator, provider, catalogue), with long-context rates",
        # Who set a price: prices sync writes the catalogue's and the provider's rows and
        # never one over an operator's; every row before this was an operator's. A price's
        # long-context rates bill a prompt above long_context_above tokens (NULL: none).
        sqlite="""
        ALTER TABLE prices ADD COLUMN source TEXT NOT NULL DEFAULT 'operator'
            CHECK (source IN ('operator', 'provider', 'catalogue'));
        ALTER TABLE prices ADD COLUMN long_context_above INTEGER
            CHECK (long_context_above > 0);
        ALTER TABLE prices ADD COLUMN long_input_per_mtok TEXT;
        ALTER TABLE prices ADD COLUMN long_output_per_mtok TEXT;
        ALTER TABLE prices ADD COLUMN long_cached_input_per_mtok TEXT;
        ALTER TABLE prices ADD COLUMN long_cache_write_per_mtok TEXT;
        ALTER TABLE prices ADD COLUMN long_cache_write_1h_per_mtok TEXT;
        """,
        postgres="""
        ALTER TABLE prices
            ADD COLUMN source TEXT NOT NULL DEFAULT 'operator'
                CHECK (source IN ('operator', 'provider', 'catalogue')),
            ADD COLUMN long_context_above INTEGER CHECK (long_context_above > 0),
            ADD COLUMN long_input_per_mtok NUMERIC CHECK (long_input_per_mtok >= 0),
            ADD COLUMN long_output_per_mtok NUMERIC CHECK (long_output_per_mtok >= 0),
            ADD COLUMN long_cached_input_per_mtok NUMERIC
                CHECK (long_cached_input_per_mtok >= 0),
            ADD COLUMN long_cache_write_per_mtok NUMERIC CHECK (long_cache_write_per_mtok >= 0),
            ADD COLUMN long_cache_write_1h_per_mtok NUMERIC
                CHECK (long_cache_write_1h_per_mtok >= 0);
        """,
    ),
    Migration(
        12,
        "refusals: requests the gateway refused before admission, counted per minute",
        # No usage record is made for a request that was never admitted: its refusal is
        # counted here (llm_gateway.billing.refusals), one row per minute, key ('' when
        # none authenticated), subject, status and code, added to by every replica's
        # upsert. Kept as long as usage records (USAGE_RETENTION_DAYS), by its index.
        sqlite="""
        CREATE TABLE refusal_counts (
            minute INTEGER NOT NULL,
            key_id TEXT NOT NULL,
            subject_id TEXT NOT NULL,
            status INTEGER NOT NULL CHECK (status BETWEEN 400 AND 599),
            code TEXT NOT NULL CHECK (length(code) > 0),
            requests INTEGER NOT NULL CHECK (requests > 0),
            PRIMARY KEY (minute, key_id, subject_id, status, code)
        );
        """,
        postgres="""
        CREATE TABLE refusal_counts (
            minute TIMESTAMPTZ NOT NULL,
            key_id TEXT NOT NULL,
            subject_id TEXT NOT NULL,
            status INTEGER NOT NULL CHECK (status BETWEEN 400 AND 599),
            code TEXT NOT NULL CHECK (length(code) > 0),
            requests BIGINT NOT NULL CHECK (requests > 0),
            PRIMARY KEY (minute, key_id, subject_id, status, code)
        );
        """,
    ),
    Migration(
        13,
        "budget alerts: which threshold of which budget's window was alerted, by whom",
        # One row per alert sent (llm_gateway.stores.alert_claims): the primary key is the
        # budget's counter (so its window's start) and the threshold, so that of all the
        # replicas that see a budget reach 80 % the one whose insert wrote the row sends
        # it (ON CONFLICT DO NOTHING). Swept a day after its window ends.
        sqlite="""
        CREATE TABLE budget_alerts (
            alert_key TEXT PRIMARY KEY CHECK (length(alert_key) > 0),
            alert_id TEXT NOT NULL,
            claimed_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX budget_alerts_expires ON budget_alerts (expires_at);
        """,
        postgres="""
        CREATE TABLE budget_alerts (
            alert_key TEXT PRIMARY KEY CHECK (length(alert_key) > 0),
            alert_id TEXT NOT NULL,
            claimed_at TIMESTAMPTZ NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL
        );
        CREATE INDEX budget_alerts_expires ON budget_alerts (expires_at);
        """,
    ),
    Migration(
        14,
        "request limits as token buckets: a key's burst, and the buckets shared by replicas",
        # A key's burst is its bucket's capacity under RATE_LIMIT_ALGORITHM=token-bucket
        # (NULL: its limit). A bucket's row is its tokens and when they were written, in
        # epoch seconds on the database's clock (llm_gateway.limits.postgres refills and
        # takes in one statement); one row per (key, limit setting), as the windows' rows,
        # so nothing needs sweeping. SQLite gets the same table to keep one history.
        sqlite="""
        ALTER TABLE gateway_keys ADD COLUMN rate_limit_burst INTEGER
            CHECK (rate_limit_burst > 0);
        CREATE TABLE rate_limit_buckets (
            bucket TEXT PRIMARY KEY,
            tokens REAL NOT NULL,
            refilled_at REAL NOT NULL
        );
        """,
        postgres="""
        ALTER TABLE gateway_keys ADD COLUMN rate_limit_burst INTEGER
            CHECK (rate_limit_burst > 0);
        CREATE TABLE rate_limit_buckets (
            bucket TEXT PRIMARY KEY,
            tokens DOUBLE PRECISION NOT NULL,
            refilled_at DOUBLE PRECISION NOT NULL
        );
        """,
    ),
    Migration(
        15,
        "the last reconciliation's drift per provider and model",
        # ``llm-gateway reconcile`` (a CronJob) writes each model's worst relative drift
        # against the provider's bill, replacing that provider's rows whole; every gateway's
        # /metrics exports them (llm_gateway_reconcile_drift_ratio).
        sqlite="""
        CREATE TABLE reconcile_drift (
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL CHECK (length(model) > 0),
            drift_ratio REAL NOT NULL,
            within_tolerance INTEGER NOT NULL CHECK (within_tolerance IN (0, 1)),
            since TEXT NOT NULL,
            until TEXT NOT NULL,
            reconciled_at REAL NOT NULL,
            PRIMARY KEY (provider, model)
        );
        """,
        postgres="""
        CREATE TABLE reconcile_drift (
            provider TEXT NOT NULL CHECK (length(provider) > 0),
            model TEXT NOT NULL CHECK (length(model) > 0),
            drift_ratio DOUBLE PRECISION NOT NULL,
            within_tolerance BOOLEAN NOT NULL,
            since DATE NOT NULL,
            until DATE NOT NULL,
            reconciled_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (provider, model)
        );
        """,
    ),
)
