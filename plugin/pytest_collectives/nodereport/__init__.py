"""Node validation: the session's part (collect.py, settings.py), and three families: judging/ (the checks
and the verdict), outputs/ (report.json and the files written from it) and fleet/ (many nodes' reports)."""
