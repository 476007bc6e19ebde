-- jobq schema, version 7: what the dashboard reads, and recorded output.
-- Forward-only: never edit a released migration, add a new file instead.

-- The dashboard's jobs list filtered by state, newest first, paged by keyset
-- (`state = $1 AND id < $before ORDER BY id DESC`): a range scan however many rows the
-- table holds. The list without a state filter pages on the primary key.
CREATE INDEX jobs_state_id_idx ON jobq.jobs (state, id);

-- Recorded output: what a handler's `Ok(value)` returned (at most 64 KiB serialized),
-- written with the attempt's completion.
ALTER TABLE jobq.jobs ADD COLUMN output jsonb;
