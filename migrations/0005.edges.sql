-- Each Worker says how often it advertises itself (issue 20): it is alive while its
-- advertisement is younger than a few of its own intervals (ALIVE_BEATS in
-- trioworker/_store/reads.py), not a fixed 180 s that kept a SIGKILLed Worker "alive"
-- for three minutes. NULL: a Worker of an earlier version, judged by the fixed window.
-- depends: 0004.schema

ALTER TABLE work_workers ADD COLUMN advertise_every double precision;
