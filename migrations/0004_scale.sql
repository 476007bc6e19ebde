-- jobq schema, version 4: claims whose cost does not grow with rows they will not take.
-- Forward-only: never edit a released migration, add a new file instead.
--
-- A job whose run_after is in the future (scheduled for later, or a retry waiting for
-- its backoff) is `scheduled`, not `pending`: the promoter moves it to `pending` when it
-- is due, so the claim index holds due rows only and a million jobs scheduled for
-- tomorrow cost a claim nothing. `pending` now means "due, waiting for a worker".

ALTER TABLE jobq.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE jobq.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('scheduled', 'pending', 'running', 'done', 'failed', 'cancelled'));

-- Rows already waiting for a future time move to the new state.
UPDATE jobq.jobs SET state = 'scheduled' WHERE state = 'pending' AND run_after > now();

-- The claim probes this index once per served kind, so rows of kinds a worker does not
-- serve are never read. It replaces the kind-less claim index.
CREATE INDEX jobs_claim_kind_idx ON jobq.jobs (queue, kind, priority, run_after, id)
    WHERE state = 'pending';
DROP INDEX jobq.jobs_claim_idx;

-- The promoter: scheduled rows by due time.
CREATE INDEX jobs_scheduled_idx ON jobq.jobs (run_after)
    WHERE state = 'scheduled';

-- "Does this queue have jobs?" (pause, resume) for rows no other index finds by queue:
-- pending rows are in the claim index and running rows are few. On a queue with no
-- live jobs this was a scan of the whole table. Entries are written when a row reaches
-- one of these states, never by a due insert.
CREATE INDEX jobs_queue_idx ON jobq.jobs (queue)
    WHERE state IN ('scheduled', 'done', 'failed', 'cancelled');
