-- jobq schema, version 3: a fencing token that never repeats.
-- Forward-only: never edit a released migration, add a new file instead.

-- Every claim takes the next lease generation, and every fenced write of the attempt
-- (effect, complete-in-transaction, heartbeat, outcome, hand-back) checks it. A graceful
-- hand-back refunds the attempt budget (`attempts - 1`) but never the generation, so a
-- leftover task of a handed-back attempt can never pass for the next claim's attempt.
-- A constant default: the column is added without rewriting the table.
ALTER TABLE jobq.jobs ADD COLUMN lease_gen bigint NOT NULL DEFAULT 0;
