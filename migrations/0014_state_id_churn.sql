-- jobq schema, version 14: the dashboard's state index leaves out the states rows pass
-- through. Forward-only: never edit a released migration, add a new file instead.
--
-- `jobs_state_id_idx (state, id)` held an entry for every version of every row, so each
-- enqueue, claim and completion wrote one, and a statement about `pending` or `running`
-- rows could be planned on it: with statistics taken while the queue was nearly empty
-- the planner walked every `pending` entry of it and sorted them, instead of reading the
-- claim index in order (seen on the claim and on the expiry sweep while a snapshot was
-- held open: 300,000 rows sorted on disk per claim of 32). It now holds scheduled and
-- finished rows only, the lists an operator pages through; the dashboard pages pending
-- and running jobs on the primary key.
CREATE INDEX jobs_state_id_idx_0014 ON jobq.jobs (state, id)
    WHERE state IN ('scheduled', 'done', 'failed', 'cancelled');
DROP INDEX jobq.jobs_state_id_idx;
ALTER INDEX jobq.jobs_state_id_idx_0014 RENAME TO jobs_state_id_idx;
