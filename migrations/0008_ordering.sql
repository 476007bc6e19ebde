-- jobq schema, version 8: per-key ordering. Jobs of one (ordering_scope, ordering_key)
-- run one at a time in id order; a `failed` one parks the rest until an operator acts.
-- Forward-only: never edit a released migration, add a new file instead.

ALTER TABLE jobq.jobs
    -- The key's scope (the kind, or a named scope shared by several kinds) and the key;
    -- both NULL for an unordered job.
    ADD COLUMN ordering_scope   text,
    ADD COLUMN ordering_key     text,
    -- The job of the same key this one waits behind (the one enqueued before it, while
    -- that one is unfinished); NULL when it is the head of its key, or unordered.
    ADD COLUMN blocked_by       bigint,
    -- Set by `jobq unpark --skip-failed` on a failed job: it stays `failed` but no longer
    -- blocks its key.
    ADD COLUMN ordering_skipped boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT jobs_ordering_pair CHECK ((ordering_scope IS NULL) = (ordering_key IS NULL));

-- The members of each key's chain: every unfinished job of the key, and its failed jobs
-- that still block it. Enqueue reads the tail (highest id) here; an unblock reads the
-- nearest member below a waiting job.
CREATE INDEX jobs_ordering_idx ON jobq.jobs (ordering_scope, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND NOT ordering_skipped
      AND state IN ('scheduled', 'pending', 'running', 'failed');

-- Who waits behind a job that just finished (one probe per finished ordered job).
CREATE INDEX jobs_blocked_idx ON jobq.jobs (blocked_by) WHERE blocked_by IS NOT NULL;

-- "Does this queue have jobs?" for pending rows the claim index no longer holds.
CREATE INDEX jobs_blocked_queue_idx ON jobq.jobs (queue)
    WHERE state = 'pending' AND blocked_by IS NOT NULL;

-- Failed jobs that park their key: what stats, `jobq status` and metrics count from.
CREATE INDEX jobs_parked_idx ON jobq.jobs (id)
    WHERE state = 'failed' AND ordering_key IS NOT NULL AND NOT ordering_skipped;

-- The claim index again, without waiting jobs: a key's blocked jobs cost a claim
-- nothing, however many there are. Same name and columns as in version 4.
CREATE INDEX jobs_claim_kind_idx_0008 ON jobq.jobs (queue, kind, priority, run_after, id)
    WHERE state = 'pending' AND blocked_by IS NULL;
DROP INDEX jobq.jobs_claim_kind_idx;
ALTER INDEX jobq.jobs_claim_kind_idx_0008 RENAME TO jobs_claim_kind_idx;
