-- jobq schema, version 9: cluster-wide concurrency and rate limits, enforced by the claim.
-- Forward-only: never edit a released migration, add a new file instead.

-- The keys a job is limited by (set at enqueue from `concurrency_key` / `rate_key`).
ALTER TABLE jobq.jobs ADD COLUMN concurrency_key text, ADD COLUMN rate_key text;

-- Limits as data. One row per (scope, name, source): `code` rows are written by each
-- runtime at start from its job types and builder; `operator` rows by `jobq limit set`.
-- Where both exist the operator's values win, field by field (a NULL field falls back to
-- the code's). `per_key`: the concurrency limit counts per `jobs.concurrency_key`;
-- `rate_per_key`: each `jobs.rate_key` has a bucket of its own.
CREATE TABLE jobq.limits (
    scope        text        NOT NULL CHECK (scope IN ('kind', 'queue')),
    name         text        NOT NULL,
    source       text        NOT NULL CHECK (source IN ('code', 'operator')),
    concurrency  integer     CHECK (concurrency >= 1),
    per_key      boolean     NOT NULL DEFAULT false,
    rate_count   integer     CHECK (rate_count >= 1),
    rate_secs    float8      CHECK (rate_secs > 0),
    burst        integer     CHECK (burst >= 1),
    rate_per_key boolean     NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text,
    PRIMARY KEY (scope, name, source),
    CHECK (scope = 'kind' OR (rate_count IS NULL AND NOT per_key AND NOT rate_per_key)),
    CHECK ((rate_count IS NULL) = (rate_secs IS NULL))
);

-- Token buckets, charged by the claim. `key` is the job's rate key, or the kind's name
-- for the kind-wide bucket. `refilled_at` in the future is a throttle
-- (`ctx.throttle`): no token before it, then the bucket refills from empty.
CREATE TABLE jobq.rate_buckets (
    kind        text        NOT NULL,
    key         text        NOT NULL,
    tokens      float8      NOT NULL,
    refilled_at timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE INDEX rate_buckets_throttled_idx ON jobq.rate_buckets (refilled_at);
