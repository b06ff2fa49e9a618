"""The merge job service: HTTP API, durable job table, and workers that run merges through the engine."""
