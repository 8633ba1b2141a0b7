"""Running a test on every rank: the session, its two launchers, the ranks' side."""
