"""AUTO CDC: batches of change events applied in sequence order, kept as SCD type 1 or 2, through the engine's MERGE
(docs/auto-cdc.md)."""
