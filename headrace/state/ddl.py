"""The ``_headrace`` tables of pipeline and table state (the log index's own are in ``headrace.log.index``)."""

from __future__ import annotations

DDL = """
CREATE SCHEMA IF NOT EXISTS _headrace;
CREATE TABLE IF NOT EXISTS _headrace.pipeline_meta (
    pipeline          text PRIMARY KEY,
    system_identifier text NOT NULL,
    slot_name         text NOT NULL,
    publication       text NOT NULL,
    captured_lsn      bigint NOT NULL DEFAULT 0,  -- end LSN of the last transaction in the log
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS _headrace.tables (
    pipeline      text NOT NULL,
    table_oid     bigint NOT NULL,
    schema_name   text NOT NULL,
    table_name    text NOT NULL,
    state         text NOT NULL,
    resume_state  text,               -- state to return to after ERRORED or PAUSED
    snapshot_lsn  bigint,
    applied_lsn   bigint,
    rows_copied   bigint NOT NULL DEFAULT 0,
    rows_applied  bigint NOT NULL DEFAULT 0,
    error         text,
    error_count   integer NOT NULL DEFAULT 0,
    retry_at      timestamptz,
    table_schema  jsonb NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
-- Highest position this pipeline may have confirmed to its slot: at least captured_lsn, and the
-- stream's wal_end when psycopg2 forwarded the confirmation past idle WAL. A slot beyond it was
-- advanced by someone else.
ALTER TABLE _headrace.pipeline_meta ADD COLUMN IF NOT EXISTS acked_lsn bigint NOT NULL DEFAULT 0;
-- The source's own spelling of captured_lsn when the int cannot resume on another server (MySQL/MariaDB:
-- the GTID state, with the server and epoch the int belongs to), registered with it.
ALTER TABLE _headrace.pipeline_meta ADD COLUMN IF NOT EXISTS captured_token text;
-- Schema changes and table events applied to targets (add_column, drop_table, ...): status and audit.
CREATE TABLE IF NOT EXISTS _headrace.ddl_events (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    table_name  text NOT NULL,
    kind        text NOT NULL,
    detail      text NOT NULL,
    lsn         bigint,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ddl_events_pipeline ON _headrace.ddl_events (pipeline, applied_at);
-- Tables found by discovery (source.schemas / all_tables) that cannot be replicated, and why.
-- Not tracked; assessed again at each discovery pass, so fixing the table gets it replicated.
CREATE TABLE IF NOT EXISTS _headrace.refused_tables (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    table_name  text NOT NULL,
    reason      text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
-- What an ERRORED table's error is (transient, terminal, unknown) and what fixes it (status, readyz).
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS error_kind text;
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS error_fix text;
-- The lanes of the table's last applied batch, when they changed (build, apply, and why): status.
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS lanes jsonb;
-- A partitioned table's leaf partitions (oids) at the catalog watch's last look: a partition attached
-- or detached while headrace was stopped is told from them at the next start.
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS partitions jsonb;
"""
