-- Back to version 20: the pick walks the keys upwards from the cursor, each probe seeking to a
-- key's head; the keyed pick index deduplicates again. Version 18's gendurable_pick (its up
-- migration run again: the function's body is replaced, and so is the hand-off's, unchanged
-- since; its column exists already, but its ADD COLUMN IF NOT EXISTS takes the table's exclusive
-- lock for a moment, as version 18's down does with version 17's).
ALTER INDEX {{schema}}.gendurable_instances_pick_keyed RESET (deduplicate_items);
-- include: 018_seen_at_timeout.up.sql
