"""Session-level modes that change how the tests run: burn-in passes (soak), pytest-xdist workers (xdist)."""
