"""One router per resource: merge jobs, health, metrics."""
