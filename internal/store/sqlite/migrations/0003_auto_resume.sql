-- Auto-resume: a paused sandbox is resumed by its next use. Until now it
-- went with auto_pause.
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
UPDATE sandboxes SET auto_resume = auto_pause;
