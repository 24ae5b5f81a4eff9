-- Run by yoyo after every `migrate` that applied anything (a post-apply hook: never
-- recorded as applied). It pins each function of the queue to its schema, including
-- those a later migration added or replaced (migrations/0004.schema.sql says why;
-- docs/design/schema.md has the rule for migration authors).
-- In a DO block: yoyo prints the rows of a migration's SELECT.
DO $$ BEGIN PERFORM work_pin_search_path(); END $$;
