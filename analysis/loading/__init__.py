"""Loading result rows: run folders, results files and pytest-benchmark JSON into one frame (schema: bench.spec)."""
