-- The trace context an item was enqueued in (docs/adr/0010-tracing.md): the carrier an
-- OpenTelemetry propagator wrote, {"traceparent": "00-...", "tracestate": "..."} for
-- W3C trace context, so each attempt's span joins the request that asked for the work.
-- NULL when there was none. Any writer may set it; plain SQL enqueues too.
-- depends: 0004.schedules-and-retries

-- Nullable without a default, so adding it rewrites nothing. The check is added NOT
-- VALID: every existing row is NULL and passes it, and validating would scan the
-- whole table under this ALTER's exclusive lock, holding up every claim meanwhile.
-- New and updated rows are checked all the same.
ALTER TABLE work_items ADD COLUMN trace_context jsonb;
ALTER TABLE work_items ADD CONSTRAINT work_items_trace_context_sane
    CHECK (jsonb_typeof(trace_context) = 'object'
           AND NOT jsonb_path_exists(trace_context, '$.* ? (@.type() != "string")')
           AND octet_length(trace_context::text) <= 8192)
    NOT VALID;
