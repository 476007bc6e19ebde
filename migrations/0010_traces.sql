-- jobq schema, version 10: the trace context a job was enqueued in.
-- Forward-only: never edit a released migration, add a new file instead.

-- W3C trace context headers ({"traceparent": …, "tracestate": …}) captured at enqueue
-- with the `otel` feature; each attempt's span continues that trace. NULL otherwise.
ALTER TABLE jobq.jobs ADD COLUMN trace_context jsonb;
