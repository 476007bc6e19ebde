-- jobq schema, version 13: a cheaper outbox row.
-- Forward-only: never edit a released migration, add a new file instead.
--
-- An outbox row is written inside the caller's transaction, so what PostgreSQL does per
-- row there is the outbox's price. Three things cost more than they protect:
-- - `outbox_seq_key`: a unique index on `seq`, which a sequence fills; the relay reads
--   `seq` through `outbox_unpublished_idx`. One index entry less per event.
-- - The CHECK on `event_type`: PostgreSQL reads a table's CHECK expressions from their
--   stored text for every INSERT statement; a domain's check is read once per session.
--   Same rule, same SQLSTATE (23514) for a row written by hand.
-- - In `jobq.publish`: a regular expression for the event id; uuid's own input check
--   does the same.

ALTER TABLE jobq.outbox DROP CONSTRAINT outbox_seq_key;

-- In this order so the table is not rewritten: a column changes to a domain with
-- constraints by rewriting the table, to one without by relabelling it. The domain's
-- check is NOT VALID only in that it did not re-read existing rows, which the table
-- CHECK dropped in this same transaction guaranteed; it holds for every new value.
CREATE DOMAIN jobq.event_type AS text;
ALTER TABLE jobq.outbox ALTER COLUMN event_type TYPE jobq.event_type;
ALTER DOMAIN jobq.event_type
    ADD CONSTRAINT event_type_length CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
ALTER TABLE jobq.outbox DROP CONSTRAINT outbox_event_type_check;

-- As in version 12, the event id checked by its cast; the rules are unchanged.
CREATE OR REPLACE FUNCTION jobq.publish(event jsonb) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_id      uuid;
    v_idtext  text    := event->>'id';
    v_type    text    := event->>'type';
    v_at      text    := event->>'aggregate_type';
    v_ai      text    := event->>'aggregate_id';
    v_version jsonb   := event->'aggregate_version';
    v_av      bigint;
    v_payload jsonb   := event->'payload';
    v_headers jsonb   := coalesce(event->'headers', '{}');
    v_bad     text;
BEGIN
    IF event IS NULL OR jsonb_typeof(event) <> 'object' THEN
        PERFORM jobq.publish_reject('invalid_event', 'the event must be a JSON object');
    END IF;
    IF v_type IS NULL OR btrim(v_type) = '' OR octet_length(v_type) > 200
       OR jsonb_typeof(event->'type') <> 'string' THEN
        PERFORM jobq.publish_reject('invalid_event',
            format('event type must be 1 to 200 bytes and not blank, got %s', coalesce(event->'type', 'null')));
    END IF;
    IF v_payload IS NULL THEN
        PERFORM jobq.publish_reject('invalid_event', format('event `%s` has no payload', v_type));
    END IF;
    IF octet_length(v_payload::text) > 1048576 THEN
        PERFORM jobq.publish_reject('payload_too_large',
            format('payload of event `%s` is %s bytes; the limit is 1048576 bytes', v_type, octet_length(v_payload::text)));
    END IF;
    IF v_idtext IS NULL THEN
        -- A UUIDv7: 48 bits of Unix milliseconds over a random UUID, version bits 0111.
        v_id := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
    ELSIF jsonb_typeof(event->'id') <> 'string' THEN
        PERFORM jobq.publish_reject('invalid_event', format('event id %s is not a UUID', event->'id'));
    ELSE
        -- uuid's own input check: SQLSTATE 22P02 from this function, which
        -- `outbox::rejection` classifies as `invalid_event` (cheaper than a regex here).
        v_id := v_idtext::uuid;
    END IF;
    IF (v_at IS NULL) <> (v_ai IS NULL)
       OR octet_length(v_at) NOT BETWEEN 1 AND 200 OR octet_length(v_ai) NOT BETWEEN 1 AND 500 THEN
        PERFORM jobq.publish_reject('invalid_event', format(
            'aggregate type (1 to 200 bytes) and id (1 to 500 bytes) must not be empty, got %s %s',
            coalesce(event->'aggregate_type', 'null'), coalesce(event->'aggregate_id', 'null')));
    END IF;
    IF v_version IS NOT NULL AND jsonb_typeof(v_version) <> 'null' THEN
        IF v_at IS NULL OR jsonb_typeof(v_version) <> 'number'
           OR v_version::numeric <> trunc(v_version::numeric)
           OR v_version::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            PERFORM jobq.publish_reject('invalid_event', format(
                'aggregate version must be an integer and needs an aggregate, got %s', v_version));
        END IF;
        v_av := v_version::numeric::bigint;
    END IF;
    IF v_headers <> '{}' THEN
        IF jsonb_typeof(v_headers) <> 'object' THEN
            PERFORM jobq.publish_reject('invalid_event', 'headers must be an object of strings');
        END IF;
        SELECT k INTO v_bad FROM jsonb_each(v_headers) AS h(k, v)
        WHERE k !~ '^[!-9;-~]+$' OR lower(k) LIKE 'jobq-%' OR lower(k) = 'nats-msg-id'
           OR jsonb_typeof(v) <> 'string' OR (v #>> '{}') ~ '[\r\n]'
        LIMIT 1;
        IF FOUND THEN
            PERFORM jobq.publish_reject('invalid_event', format(
                'header %s is not allowed: names are visible ASCII without '':'', not `Jobq-*` or `Nats-Msg-Id`; values are strings without line breaks',
                to_jsonb(v_bad)));
        END IF;
    END IF;
    INSERT INTO jobq.outbox
        (id, event_type, aggregate_type, aggregate_id, aggregate_version, agg_key, payload, headers)
    VALUES (v_id, v_type, v_at, v_ai, v_av,
            CASE WHEN v_at IS NULL THEN 'event:' || v_id::text ELSE v_at || ':' || v_ai END,
            v_payload, v_headers);
    RETURN v_id;
END
$fn$;
