-- jobq schema, version 11: a generation per limited kind and queue, so that a limited
-- claim can read its usage and claim in one statement.
-- Forward-only: never edit a released migration, add a new file instead.

-- `key` is the limit's 64-bit key (a hash of `kind:<name>` or `queue:<name>`, computed
-- by the runtime). Every claim that takes jobs of a limited kind or queue adds one to
-- `gen` in the statement that claims, on the condition that `gen` is still the value
-- its usage was read with; a claim that finds it changed (another claim committed
-- since it read) takes nothing. A claim that takes nothing writes nothing here.
CREATE TABLE jobq.limit_gens (
    key bigint PRIMARY KEY,
    gen bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
