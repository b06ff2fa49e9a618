"""Request and response bodies of the public API (``docs/api.md``), exactly; nothing else."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from engine.inline_rows import MAX_NESTING

NonEmpty = Annotated[str, Field(min_length=1)]
Assignments = Annotated[dict[str, NonEmpty], Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- sources --------------------------------------------------------------------------------------------------


def _option_texts(options: dict[str, str | bool | int | float]) -> dict[str, str]:
    """Spark's reader options are strings (JSON's true/false are Spark's "true"/"false"): taken as text here, so
    ``true`` and ``"true"`` make the same body, stored and compared for an Idempotency-Key alike."""
    return {key: ("true" if v else "false") if isinstance(v, bool) else str(v) for key, v in options.items()}


class TableSourceIn(_Strict):
    format: Literal["delta", "parquet", "json", "csv"]
    path: NonEmpty
    options: Annotated[dict[str, StrictStr | StrictBool | StrictInt | StrictFloat], AfterValidator(_option_texts)] = (
        Field(
            default_factory=dict,
            description="Spark reader options; numbers and booleans are passed as Spark takes them, as strings. A "
            "Delta source takes only versionAsOf or timestampAsOf (Delta's time travel), or readChangeFeed with "
            "startingVersion or startingTimestamp and optionally endingVersion or endingTimestamp (its Change Data "
            "Feed).",
        )
    )


def _nests_within(value: Any, limit: int) -> bool:
    """Whether JSON objects and arrays nest at most ``limit`` levels in ``value``; walked without recursion."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > limit:
            return False
        for child in current.values() if isinstance(current, dict) else current:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return True


def _row_value(value: Any) -> Any:
    """A row's value nests at most ``MAX_NESTING`` levels: deeper data fails in Spark, and beyond some 250
    levels in the JSON serializer that stores the job."""
    if isinstance(value, (dict, list)) and not _nests_within(value, MAX_NESTING):
        raise PydanticCustomError(
            "nesting_too_deep",
            "objects and arrays nest more than {limit} levels deep; at most {limit} are accepted",
            {"limit": MAX_NESTING},
        )
    return value


RowValue = Annotated[Any, AfterValidator(_row_value)]


class RowsSourceIn(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    rows: list[dict[str, RowValue]]
    schema_ddl: str | None = Field(default=None, alias="schema", description="A Spark DDL column list.")


def _source_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "rows" if "rows" in value else "table"
    return "rows" if isinstance(value, RowsSourceIn) else "table"


SourceIn = Annotated[
    Annotated[TableSourceIn, Tag("table")] | Annotated[RowsSourceIn, Tag("rows")],
    Discriminator(_source_kind),
]

EngineName = Literal["builtin", "delta"]
DeletionVectorsChoice = Annotated[
    Literal["auto", "off"],
    Field(
        description='Delta\'s spark.databricks.delta.merge.deletionVectors.persistent for this merge: "auto" '
        'writes deletion vectors where the table enables them, "off" rewrites the touched files instead.'
    ),
]
CallbackUrl = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=2048,
        description="An http or https URL the service POSTs the finished job to, signed (docs/api.md).",
    ),
]
"""Which engine runs a merge: the service's own, or Delta Lake's own MERGE INTO (``service.engines``)."""

# --- clauses --------------------------------------------------------------------------------------------------


class UpdateClause(_Strict):
    action: Literal["update"]
    condition: NonEmpty | None = None
    set: Assignments


class UpdateAllClause(_Strict):
    action: Literal["update_all"]
    condition: NonEmpty | None = None


class DeleteClause(_Strict):
    action: Literal["delete"]
    condition: NonEmpty | None = None


class InsertClause(_Strict):
    action: Literal["insert"]
    condition: NonEmpty | None = None
    values: Assignments


class InsertAllClause(_Strict):
    action: Literal["insert_all"]
    condition: NonEmpty | None = None


MatchedClause = Annotated[UpdateClause | UpdateAllClause | DeleteClause, Field(discriminator="action")]
NotMatchedClause = Annotated[InsertClause | InsertAllClause, Field(discriminator="action")]
NotMatchedBySourceClause = Annotated[UpdateClause | DeleteClause, Field(discriminator="action")]
CLAUSE_TAGS = frozenset({"update", "update_all", "delete", "insert", "insert_all"})


class StructuredMergeIn(_Strict):
    """A merge as a structured spec."""

    target: NonEmpty
    source: SourceIn
    target_alias: NonEmpty = "target"
    source_alias: NonEmpty = "source"
    on: NonEmpty
    when_matched: list[MatchedClause] = Field(default_factory=list)
    when_not_matched: list[NotMatchedClause] = Field(default_factory=list)
    when_not_matched_by_source: list[NotMatchedBySourceClause] = Field(default_factory=list)
    schema_evolution: StrictBool = False
    dry_run: StrictBool = False
    deletion_vectors: DeletionVectorsChoice = "auto"
    engine: EngineName | None = None
    callback: CallbackUrl | None = None


class SqlMergeIn(_Strict):
    """The same merge as SQL text, in the Delta Lake dialect of Spark SQL. ``schema_evolution`` and ``dry_run``
    mean what they mean for a structured spec (``MERGE WITH SCHEMA EVOLUTION INTO`` turns evolution on too)."""

    sql: NonEmpty
    schema_evolution: StrictBool = False
    dry_run: StrictBool = False
    deletion_vectors: DeletionVectorsChoice = "auto"
    engine: EngineName | None = None
    callback: CallbackUrl | None = None


ColumnList = Annotated[list[NonEmpty], Field(min_length=1)]


def _scd_type(value: Any) -> int:
    """1 or 2, given as a number or as its string; not ``true`` or ``2.0``, which a lax Literal would take."""
    if (type(value) is int and value in (1, 2)) or (isinstance(value, str) and value in ("1", "2")):
        return int(value)
    raise PydanticCustomError("literal_error", 'Input should be 1 or 2 (or the string "1" or "2")')


class AutoCdcIn(_Strict):
    """How a batch of change events is applied (docs/auto-cdc.md); names as in Databricks' AUTO CDC."""

    keys: ColumnList = Field(description="The columns that identify a row.")
    sequence_by: NonEmpty | ColumnList = Field(
        description="A column or expression that orders the events of a key; several are compared in order."
    )
    apply_as_deletes: NonEmpty | None = Field(default=None, description="A condition true for delete events.")
    apply_as_truncates: NonEmpty | None = Field(
        default=None, description="A condition true for truncate events (SCD type 1 only)."
    )
    column_list: ColumnList | None = None
    except_column_list: ColumnList | None = None
    ignore_null_updates: StrictBool = False
    ignore_null_updates_column_list: ColumnList | None = None
    ignore_null_updates_except_column_list: ColumnList | None = None
    stored_as_scd_type: Annotated[
        Literal[1, 2],
        BeforeValidator(_scd_type),
        WithJsonSchema(
            {"enum": [1, 2, "1", "2"], "description": '1 or 2; also "1" or "2", as Databricks\' Python API takes it.'}
        ),
    ] = 1
    track_history_column_list: ColumnList | None = None
    track_history_except_column_list: ColumnList | None = None


class AutoCdcMergeIn(_Strict):
    """A batch of change events applied in sequence order, kept as SCD type 1 or 2: AUTO CDC."""

    target: NonEmpty
    source: SourceIn
    auto_cdc: AutoCdcIn
    dry_run: StrictBool = False
    deletion_vectors: DeletionVectorsChoice = "auto"
    engine: EngineName | None = None
    callback: CallbackUrl | None = None


def _merge_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "sql" if "sql" in value else "auto_cdc" if "auto_cdc" in value else "spec"
    if isinstance(value, SqlMergeIn):
        return "sql"
    return "auto_cdc" if isinstance(value, AutoCdcMergeIn) else "spec"


MergeRequest = Annotated[
    Annotated[StructuredMergeIn, Tag("spec")]
    | Annotated[SqlMergeIn, Tag("sql")]
    | Annotated[AutoCdcMergeIn, Tag("auto_cdc")],
    Discriminator(_merge_kind),
]
UNION_TAGS = frozenset({"spec", "sql", "auto_cdc", "table", "rows"})

# --- answers --------------------------------------------------------------------------------------------------


class FieldError(BaseModel):
    field: str
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int | None = None
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None


class JobError(BaseModel):
    """Why a job failed or was cancelled, as an RFC 9457 problem object."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    detail: str | None = None
    status: int | None = None


Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
PhaseName = Literal["queued", "preparing_source", "finding_touched_files", "writing", "committing", "done"]


class CallbackOut(BaseModel):
    """A job's completion callback and how its delivery stands."""

    url: str
    status: Literal["pending", "delivered", "failed"]
    delivery_id: str | None
    attempts: int
    last_error: str | None
    delivered_at: datetime | None


class JobOut(BaseModel):
    id: str
    status: Status
    phase: PhaseName
    target: str
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    dry_run: bool
    engine: EngineName
    table_version: int | None
    result: dict[str, int] | None
    metrics: dict[str, int] | None
    error: JobError | None
    callback: CallbackOut | None = None
    timings: dict[str, int] | None = Field(
        default=None,
        description="Where a finished job's time went, in milliseconds by segment, adding up to finished_at - "
        "submitted_at: queued, retrying, starting, the engine's phases, recording. Absent before the job ends.",
    )


class JobListOut(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
