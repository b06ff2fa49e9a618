"""Delta's identity columns in a merge's clauses: never updated; an INSERT that gives one no value generates it,
one that gives a value needs ``delta.identity.allowExplicitInsert``."""

from __future__ import annotations

from pyspark.sql.types import StructField, StructType

from engine.delta.identity import identity_columns
from engine.errors import MergeResolutionError
from engine.spec import MergeClause, MergeSpec, UpdateAction


def identity_values(
    spec: MergeSpec,
    clause: MergeClause,
    index: int,
    out_fields: list[StructField],
    values: list[tuple[str, bool]],
    given: set[str],
    where: str,
) -> set[str]:
    """Puts the generated value of each identity column the INSERT clause gives none into ``values`` (SQL, and
    whether it is an assignment to cast and check) and answers their names; refuses what Delta refuses."""
    generated: set[str] = set()
    identities = identity_columns(StructType(out_fields))
    for i, f in enumerate(out_fields):
        column = identities.get(f.name.lower())
        if column is None:
            continue
        if isinstance(clause.action, UpdateAction):
            if f.name.lower() in given:
                raise MergeResolutionError(
                    f"{where}: UPDATE on IDENTITY column {f.name} is not supported.", field=where
                )
        elif f.name.lower() not in given:
            values[i] = (column.generated_values_sql(max(1, len(spec.not_matched)), index), True)
            generated.add(f.name)
        elif not column.allow_explicit_insert:
            raise MergeResolutionError(
                f"{where}: Providing values for GENERATED ALWAYS AS IDENTITY column {f.name} is not supported.",
                field=where,
            )
    return generated
