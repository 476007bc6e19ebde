-- jobq schema, version 5: time and uniqueness — uniqueness windows over chosen states,
-- a maximum age per job, and periodic schedules whose every slot is enqueued once.
-- Forward-only: never edit a released migration, add a new file instead.

-- Whether `state` is among the states of the bitmask `states` (1 pending, 2 running,
-- 4 done, 8 failed, 16 cancelled). IMMUTABLE, so a partial index may use it: a row
-- holds its unique key exactly while its state is one of the listed ones.
CREATE FUNCTION jobq.job_state_in(states smallint, state text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (states & CASE state
        WHEN 'pending'   THEN 1
        WHEN 'scheduled' THEN 1   -- due later: still "pending" to a uniqueness rule
        WHEN 'running'   THEN 2
        WHEN 'done'      THEN 4
        WHEN 'failed'    THEN 8
        WHEN 'cancelled' THEN 16
        ELSE 0 END) <> 0
$$;

ALTER TABLE jobq.jobs
    -- md5 of the uniqueness fields (and period bucket); NULL when the kind is not unique.
    ADD COLUMN unique_key    text,
    -- The states in which the key is held, as `jobq.job_state_in` reads them.
    ADD COLUMN unique_states smallint,
    -- Past this time the job is not run or retried again: it fails with code `expired`.
    ADD COLUMN expires_at    timestamptz;

-- Uniqueness: one row per (kind, unique key) among the rows in their listed states.
-- Concurrent inserts of one key wait for each other; a rolled-back holder frees it.
CREATE UNIQUE INDEX jobs_unique_idx ON jobq.jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL AND jobq.job_state_in(unique_states, state);

-- Maintenance fails pending jobs past their age without running them.
CREATE INDEX jobs_expires_idx ON jobq.jobs (expires_at)
    WHERE state = 'pending' AND expires_at IS NOT NULL;

-- Periodic schedules, registered by the runtimes that serve them. `next_slot` is the
-- durable cursor: the earliest slot not yet handled. Each slot's job carries the
-- idempotency key `schedule:<name>:<slot>`, so no slot is ever enqueued twice.
CREATE TABLE jobq.schedules (
    name            text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    kind            text        NOT NULL,
    queue           text        NOT NULL,
    expression      text        NOT NULL,          -- a cron expression, or `every 15m`
    tz              text        NOT NULL DEFAULT 'UTC',
    missed          text        NOT NULL DEFAULT 'once',
    args            jsonb       NOT NULL,
    payload_version integer     NOT NULL DEFAULT 1,
    priority        smallint    NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL DEFAULT 25,
    max_age_secs    float8,
    next_slot       timestamptz NOT NULL,
    last_slot       timestamptz,
    last_job_id     bigint,
    paused          boolean     NOT NULL DEFAULT false,
    paused_at       timestamptz,
    paused_by       text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
