-- jobq schema, version 6: the transactional outbox and the consumers' inbox.
-- Forward-only: never edit a released migration, add a new file instead.

-- Events written in the caller's transaction (`jobq::outbox::publish`) and relayed to a
-- broker. A row is published when `published_at` is set, which the relay does only after
-- the broker acknowledged it. `agg_key` names the ordering unit: the aggregate, or the
-- event itself when it has none; events of one key are relayed in (version, seq) order.
CREATE TABLE jobq.outbox (
    id                uuid        PRIMARY KEY,                -- UUIDv7, the broker's message id
    seq               bigserial   NOT NULL UNIQUE,            -- insertion order
    event_type        text        NOT NULL CHECK (length(event_type) BETWEEN 1 AND 200),
    aggregate_type    text,
    aggregate_id      text,
    aggregate_version bigint,
    agg_key           text        NOT NULL,
    payload           jsonb       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz,
    attempts          int         NOT NULL DEFAULT 0,
    retry_at          timestamptz,                            -- backoff after a failed publish
    last_error_code   text,
    last_error        text,
    CHECK ((aggregate_type IS NULL) = (aggregate_id IS NULL))
);

-- The relay's scan: unpublished rows in insertion order.
CREATE INDEX outbox_unpublished_idx ON jobq.outbox (seq) WHERE published_at IS NULL;
-- Retention: published rows by age.
CREATE INDEX outbox_published_idx ON jobq.outbox (published_at) WHERE published_at IS NOT NULL;
-- An aggregate's unpublished rows, in order.
CREATE INDEX outbox_agg_idx ON jobq.outbox (agg_key, aggregate_version, seq) WHERE published_at IS NULL;

-- Events a consumer applied (`jobq::inbox::apply`, in the consumer's transaction).
CREATE TABLE jobq.inbox (
    consumer          text        NOT NULL,
    event_id          uuid        NOT NULL,
    aggregate_type    text,
    aggregate_id      text,
    aggregate_version bigint,
    applied_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- The last aggregate version each consumer applied; an event at or below it is stale.
CREATE TABLE jobq.inbox_aggregates (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    event_id       uuid        NOT NULL,
    applied_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);
