-- jobq schema, version 1: the job table, the effect ledger and the audit log.
-- Forward-only: never edit a released migration, add a new file instead.

CREATE TABLE jobq.jobs (
    id               bigserial   PRIMARY KEY,
    kind             text        NOT NULL CHECK (length(kind) BETWEEN 1 AND 200),
    queue            text        NOT NULL DEFAULT 'default' CHECK (length(queue) BETWEEN 1 AND 100),
    payload          jsonb       NOT NULL,
    payload_version  integer     NOT NULL DEFAULT 1,
    state            text        NOT NULL DEFAULT 'pending'
                                 CHECK (state IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    priority         smallint    NOT NULL DEFAULT 0,
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer     NOT NULL DEFAULT 25 CHECK (max_attempts >= 1),
    run_after        timestamptz NOT NULL DEFAULT now(),
    locked_until     timestamptz,
    locked_by        text,
    idempotency_key  text,
    last_error_code  text,
    last_error       text,
    errors           jsonb       NOT NULL DEFAULT '[]'::jsonb,
    cancel_requested boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    first_failed_at  timestamptz,
    last_failed_at   timestamptz,
    finished_at      timestamptz,
    CONSTRAINT jobs_running_has_lease CHECK (state <> 'running' OR locked_until IS NOT NULL)
);

-- The producer's claim: pending rows of one queue, by priority, due time, id.
CREATE INDEX jobs_claim_idx ON jobq.jobs (queue, priority, run_after, id)
    WHERE state = 'pending';

-- The reaper: running rows by lease expiry.
CREATE INDEX jobs_lease_idx ON jobq.jobs (locked_until)
    WHERE state = 'running';

-- Idempotent enqueue: one row per (kind, key) for as long as the row exists.
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobq.jobs (kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Retention and "what failed" queries: terminal rows by finish time.
CREATE INDEX jobs_finished_idx ON jobq.jobs (state, finished_at)
    WHERE state IN ('done', 'failed', 'cancelled');

-- The effect ledger: a key recorded here has happened, exactly once.
CREATE TABLE jobq.job_effects (
    effect_key  text        PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_effects_job_idx ON jobq.job_effects (job_id);

-- Every manual action an operator takes.
CREATE TABLE jobq.job_audit (
    id           bigserial   PRIMARY KEY,
    job_id       bigint,
    action       text        NOT NULL,
    actor        text        NOT NULL,
    reason       text,
    before_state text,
    after_state  text,
    detail       jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_audit_job_idx ON jobq.job_audit (job_id);
