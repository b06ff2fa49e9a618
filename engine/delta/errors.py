"""Errors of the Delta table layer that engine.errors does not name; each subclasses one from there so callers
can keep catching by kind."""

from __future__ import annotations

from engine.errors import ConcurrentModificationError, DeltaError, InvariantViolationError, SchemaMismatchError

__all__ = [
    "CommitRetriesExhaustedError",
    "ConcurrentDomainMetadataError",
    "CorruptLogError",
    "InvalidWriteError",
    "InvariantViolationError",
    "WriteSchemaMismatchError",
]


class InvalidWriteError(DeltaError):
    """A write request the layer refuses before touching storage (a bad write id, a reused folder)."""

    title = "Invalid write"


class WriteSchemaMismatchError(SchemaMismatchError):
    """The DataFrame to write does not have the table's columns and types."""


class CommitRetriesExhaustedError(ConcurrentModificationError):
    """Every attempt lost the race to a commit that did not conflict; the table is busy. Retry later."""

    title = "Too many concurrent commits"


class ConcurrentDomainMetadataError(ConcurrentModificationError):
    """A commit that won the race set a metadata domain this commit sets too (PROTOCOL.md "Domain Metadata":
    two overlapping transactions that both touch one domain conflict)."""

    title = "Concurrent change of a metadata domain"


class CorruptLogError(DeltaError):
    """A log entry cannot be parsed."""

    title = "Unreadable Delta log entry"
