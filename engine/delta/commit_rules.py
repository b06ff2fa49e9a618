"""What a commit's own actions must hold (PROTOCOL.md), whatever else happened to the table meanwhile."""

from __future__ import annotations

from collections.abc import Sequence

from engine.delta.actions import AddFile, DomainMetadata, Protocol
from engine.delta.errors import DeltaError


def check_domains(domains: Sequence[DomainMetadata], protocol: Protocol) -> None:
    """PROTOCOL.md "Domain Metadata": only on tables with the domainMetadata feature, one action per domain, and no
    ``delta.*`` domain from a caller: this layer writes the system domains it understands itself."""
    if not domains:
        return
    if "domainMetadata" not in (protocol.writer_features or ()):
        raise DeltaError("domainMetadata actions need the domainMetadata table feature, which this table lacks")
    names = [d.domain for d in domains]
    if len(names) != len(set(names)):
        raise DeltaError("A commit holds at most one domainMetadata action per domain")
    system = [n for n in names if n.startswith("delta.")]
    if system:
        raise DeltaError(f"System-controlled metadata domains cannot be set by a caller: {system}")


def check_vector_counts(adds: Sequence[AddFile]) -> None:
    """PROTOCOL.md "Deletion Vectors": a file with a vector has an accurate ``numRecords``, which readers need to
    count its live rows (Delta refuses such an add at commit too)."""
    uncounted = [
        a.path for a in adds if a.deletion_vector is not None and (a.stats is None or a.stats.num_records is None)
    ]
    if uncounted:
        raise DeltaError(f"A file with a deletion vector needs numRecords in its statistics: {uncounted[:3]}")
