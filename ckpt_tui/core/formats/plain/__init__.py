"""Files that are not a checkpoint format: JSON, text, Python and the other plain files, and the pseudo-formats a
scan names (backups a repair kept)."""
