"""`phasebench interference` folders: their rows, table and verdicts per user target (rows) and figures (figures)."""
