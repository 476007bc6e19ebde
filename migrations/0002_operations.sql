-- jobq schema, version 2: what operators need — paused queues, live workers, and an
-- index that keeps stats and retention cheap on a table of millions of finished rows.
-- Forward-only: never edit a released migration, add a new file instead.

-- A queue an operator paused: producers on every node skip it in their claim. A queue
-- without a row here is active.
CREATE TABLE jobq.queues (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 100),
    paused     boolean     NOT NULL DEFAULT false,
    paused_at  timestamptz,
    paused_by  text,
    reason     text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Live runtimes, upserted by each runtime's heartbeat: which queues (with their
-- concurrency) and kinds they serve. Rows unseen for a few intervals are deleted.
CREATE TABLE jobq.workers (
    id         text        PRIMARY KEY,
    queues     jsonb       NOT NULL,          -- {"queue": concurrency, ...}
    kinds      jsonb       NOT NULL,          -- {"kind": lease_seconds, ...}
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now()
);

-- Stats over recently finished jobs, per kind: counts by state, failures by code, and
-- run-time percentiles, all as index-only range scans on (kind, finished_at).
CREATE INDEX jobs_kind_finished_idx ON jobq.jobs (kind, finished_at)
    INCLUDE (queue, state, started_at, last_error_code)
    WHERE state IN ('done', 'failed', 'cancelled');

-- Operator actions by time (who did what, recently).
CREATE INDEX job_audit_created_idx ON jobq.job_audit (created_at);
