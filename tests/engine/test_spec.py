"""Delta's clause rules and the static checks on expressions, judged before any table is read."""

from __future__ import annotations

import dataclasses

import pytest

from engine import (
    AutoCdcSpec,
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeSpec,
    RowsSource,
    UpdateAction,
    parse_merge_sql,
    validate_auto_cdc,
    validate_spec,
)
from engine.errors import MergeResolutionError, MergeSpecError
from engine.expressions import parse_expression, sql
from engine.merge_condition import KeyedOn, KeyEquality, MergeCondition, Sides
from engine.source_options import ChangeFeedRange, DeltaRead
from engine.spec import QuerySource, TableSource

SOURCE = RowsSource(rows=[{"id": 1}])
DELETE = "WHEN MATCHED THEN DELETE"


def spec(**kwargs: object) -> MergeSpec:
    base: dict[str, object] = {
        "target": "/lake/t",
        "source": SOURCE,
        "on": "t.id = s.id",
        "target_alias": "t",
        "source_alias": "s",
    }
    base.update(kwargs)
    return MergeSpec(**base)  # type: ignore[arg-type]


def matched(action: object, condition: str | None = None) -> MergeClause:
    return MergeClause("matched", action, condition)  # type: ignore[arg-type]


def test_at_least_one_clause() -> None:
    with pytest.raises(MergeSpecError) as info:
        validate_spec(spec())
    assert str(info.value) == "There must be at least one WHEN clause in a MERGE statement."


@pytest.mark.parametrize(
    ("group", "label"),
    [("matched", "MATCHED"), ("not_matched", "NOT MATCHED"), ("not_matched_by_source", "NOT MATCHED BY SOURCE")],
)
def test_only_last_clause_may_omit_condition(group: str, label: str) -> None:
    ctype = {"matched": "matched", "not_matched": "notMatched", "not_matched_by_source": "notMatchedBySource"}[group]
    action = InsertAction(star=True) if group == "not_matched" else DeleteAction()
    clauses = (MergeClause(ctype, action, None), MergeClause(ctype, action, "s.id > 1"))  # type: ignore[arg-type]
    message = (
        f"When there are more than one {label} clauses in a MERGE statement, only the last {label} clause "
        "can omit the condition."
    )
    with pytest.raises(MergeSpecError) as info:
        validate_spec(spec(**{group: clauses}))
    assert str(info.value) == message


def test_wrong_action_for_clause_kind() -> None:
    with pytest.raises(MergeSpecError, match="insert is not allowed"):
        validate_spec(spec(matched=(matched(InsertAction(values={"id": "s.id"})),)))


def test_duplicate_assignment_is_refused() -> None:
    clause = matched(UpdateAction(set={"t.amount": "s.a", "AMOUNT": "1"}))
    with pytest.raises(MergeSpecError, match="assigned only once"):
        validate_spec(spec(matched=(clause,)))


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("condition", "s.x IN (SELECT 1)", "subqueries"),
        ("condition", "rand() > 0.5", "non-deterministic"),
        ("condition", "reflect('java.lang.System', 'exit', '0') = 1", "reflect"),
        ("value", "java_method('java.lang.Runtime', 'getRuntime')", "java_method"),
        ("value", "sum(s.amount)", "aggregate"),
        ("condition", "s.x = = 1", "cannot parse"),
    ],
)
def test_bad_expressions_are_refused_naming_the_field(field: str, text: str, message: str) -> None:
    if field == "condition":
        clause = matched(DeleteAction(), text)
        where = "when_matched[0].condition"
    else:
        clause = matched(UpdateAction(set={"amount": text}))
        where = "when_matched[0].set.amount"
    with pytest.raises(MergeSpecError) as info:
        validate_spec(spec(matched=(clause,)))
    assert where in str(info.value)
    assert message in str(info.value)


def test_same_alias_twice_is_refused() -> None:
    with pytest.raises(MergeSpecError, match="aliases must differ"):
        validate_spec(spec(source_alias="T", matched=(matched(DeleteAction()),)))


def test_parse_merge_sql_reads_every_clause_kind() -> None:
    parsed = parse_merge_sql(
        "MERGE INTO delta.`/lake/orders` AS t USING delta.`/lake/orders_updates` AS s ON t.id = s.id "
        "WHEN MATCHED AND s.op = 'D' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET amount = s.amount, t.updated_at = s.ts "
        "WHEN NOT MATCHED AND s.op <> 'D' THEN INSERT (id, amount) VALUES (s.id, s.amount) "
        "WHEN NOT MATCHED THEN INSERT * "
        "WHEN NOT MATCHED BY SOURCE AND t.ts < '2020-01-01' THEN DELETE "
        "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET amount = 0"
    )
    assert parsed.target == "/lake/orders"
    assert parsed.source == TableSource(format="delta", path="/lake/orders_updates")
    assert (parsed.target_alias, parsed.source_alias) == ("t", "s")
    assert parsed.on == "t.id = s.id"
    assert [c.action_name for c in parsed.matched] == ["delete", "update"]
    assert parsed.matched[0].condition == "s.op = 'D'"
    assert parsed.matched[1].action == UpdateAction(set={"amount": "s.amount", "t.updated_at": "s.ts"})
    assert [c.action_name for c in parsed.not_matched] == ["insert", "insertAll"]
    assert parsed.not_matched[0].action == InsertAction(values={"id": "s.id", "amount": "s.amount"})
    assert [c.action_name for c in parsed.not_matched_by_source] == ["delete", "update"]
    validate_spec(parsed)


def test_parse_merge_sql_with_a_query_source() -> None:
    parsed = parse_merge_sql(
        "MERGE INTO delta.`/lake/t` t USING (SELECT id, max(v) AS v FROM parquet.`/lake/f` GROUP BY id) s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED BY TARGET THEN INSERT *"
    )
    assert isinstance(parsed.source, QuerySource)
    assert list(parsed.source.relations.values()) == [TableSource(format="parquet", path="/lake/f")]
    assert "__merge_source_0" in parsed.source.query
    assert parsed.matched[0].action == UpdateAction(star=True)
    assert parsed.not_matched[0].action == InsertAction(star=True)


def test_merge_with_schema_evolution_syntax() -> None:
    parsed = parse_merge_sql(
        " merge with  schema\nevolution into delta.`/lake/t` t USING delta.`/lake/u` s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"
    )
    assert parsed.schema_evolution and parsed.target == "/lake/t"
    assert not parse_merge_sql(
        "MERGE INTO delta.`/lake/t` t USING delta.`/lake/u` s ON t.id = s.id WHEN MATCHED THEN DELETE"
    ).schema_evolution


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1",
        "MERGE INTO orders t USING delta.`/x` s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "MERGE INTO parquet.`/lake/t` t USING delta.`/x` s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "MERGE INTO delta.`/lake/t` t USING delta.`/x` s ON",
    ],
)
def test_parse_merge_sql_refuses_other_statements(text: str) -> None:
    with pytest.raises(MergeSpecError):
        parse_merge_sql(text)


@pytest.mark.parametrize("text", ["{#", "'", "a ++", "CASE WHEN"])
def test_every_parse_failure_is_a_spec_error(text: str) -> None:
    with pytest.raises(MergeSpecError):
        validate_spec(spec(matched=(matched(DeleteAction(), text),)))
    with pytest.raises(MergeSpecError):
        parse_merge_sql(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "MERGE INTO delta.`/l/t` t USING delta.`/l/s`@v0 s ON t.id = s.id WHEN MATCHED THEN DELETE",
            "unexpected syntax",
        ),
        ("MERGE INTO delta.`/l/t` t USING delta.`/l/s` s ON t.id = = s.id WHEN MATCHED THEN DELETE", "near '='"),
        ("MERGE INTO delta.`/l/t` t USING delta.`/l/s` s ON (t.id = s.id WHEN MATCHED THEN DELETE", "Expecting )"),
        ("MERGE INTO delta.`/l/t` t USING delta.`/l/s` s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = 'x", "closed"),
        ("MERGE INTO delta.`/l/t` t USING delta.`/l/s` s ON t.id = s.id WHEN MATCHED THEN UPDATE SET", "UPDATE SET"),
    ],
)
def test_a_statement_that_does_not_parse_says_where_in_the_callers_terms(text: str, message: str) -> None:
    """The refusal names the place and what was expected, never the parser's own objects."""
    with pytest.raises(MergeSpecError) as info:
        parse_merge_sql(text)
    assert message in str(info.value) and info.value.field.startswith("sql")
    assert not any(inner in str(info.value) for inner in ("<Token", "<class", "sqlglot", "TokenType"))


SIDES = Sides("t", "s", frozenset({"id", "day", "v"}), frozenset({"id", "day", "n"}))


def keyed_on(on: str, sides: Sides) -> KeyedOn | None:
    return MergeCondition.of(parse_expression(on, "on")).keyed_on(sides)


def test_keyed_on_splits_keys_and_one_sided_conjuncts() -> None:
    keyed = keyed_on("s.id = t.id AND t.day <=> s.day AND s.n > 1 AND t.v IS NOT NULL", SIDES)
    assert keyed is not None
    assert keyed.keys == (KeyEquality("id", "id", null_safe=False), KeyEquality("day", "day", null_safe=True))
    assert [sql(p) for p in keyed.source_only] == ["`s`.`n` > 1"]
    assert [sql(p) for p in keyed.target_only] == ["NOT `t`.`v` IS NULL"]


@pytest.mark.parametrize(
    "on",
    [
        "t.id = s.id + 1",  # a source expression: distinct keys may meet one target value
        "t.id = s.id OR t.day = s.day",
        "t.id = s.id AND t.v < s.n",  # a conjunct over both sides that is no equality
        "t.v < 3",  # no key at all
        "t.id = s.id AND x > 1",  # a reference that names neither side
    ],
)
def test_keyed_on_refuses_what_does_not_pin_one_source_key(on: str) -> None:
    assert keyed_on(on, SIDES) is None


def test_a_clause_may_not_name_the_side_it_cannot_see() -> None:
    """NOT MATCHED clauses see only the source and NOT MATCHED BY SOURCE clauses only the target: naming the
    other alias is refused before any table is read, naming the clause's field, with Delta's reason."""
    insert = MergeClause("notMatched", InsertAction(values={"id": "s.id", "v": "upper(T.v)"}))
    with pytest.raises(
        MergeResolutionError,
        match=r"when_not_matched\[0\]\.values\.v: .*WHEN NOT MATCHED "
        r"clauses can only refer to the source \(s\)",
    ):
        validate_spec(spec(not_matched=(insert,)))
    by_source = MergeClause("notMatchedBySource", DeleteAction(), "t.day < s.day")
    with pytest.raises(
        MergeResolutionError,
        match=r"when_not_matched_by_source\[0\]\.condition: .*only refer "
        r"to the target \(t\)",
    ):
        validate_spec(spec(not_matched_by_source=(by_source,)))
    # Each side's own columns, bare columns and lambda variables named like the other alias are fine.
    validate_spec(
        spec(
            matched=(matched(UpdateAction(set={"v": "concat(t.v, s.v)"}), "t.v <> s.v"),),
            not_matched=(MergeClause("notMatched", InsertAction(values={"id": "id", "v": "s.v"}), "s.id > 0"),),
            not_matched_by_source=(
                MergeClause(
                    "notMatchedBySource",
                    UpdateAction(
                        set={
                            "v": "aggregate(t.tags, '', (acc, s) -> concat(acc, s))",
                            "w": "transform(t.items, s -> s.price * 2)",
                        }
                    ),
                ),
            ),
        )
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{P} WHEN MATCHED THEN UPDATE SET * EXCEPT (a)", r"'\* EXCEPT \(a\)' is not supported"),
        ("{P} WHEN NOT MATCHED THEN INSERT * EXCEPT (a)", r"'\* EXCEPT \(a\)' is not supported"),
        (
            "MERGE INTO delta.`/lake/t` t USING parquet.`/lake/s` VERSION AS OF 3 s ON t.id = s.id "
            "WHEN MATCHED THEN DELETE",
            r"USING: time travel reads Delta tables only",
        ),
        (
            "MERGE INTO delta.`/lake/t` t USING delta.`/lake/s` TIMESTAMP AS OF current_timestamp() s "
            "ON t.id = s.id WHEN MATCHED THEN DELETE",
            r"USING: TIMESTAMP AS OF takes a timestamp literal",
        ),
        (
            "MERGE INTO delta.`/lake/t` t USING (SELECT * FROM delta.`/lake/s` VERSION AS OF -1) s "
            "ON t.id = s.id WHEN MATCHED THEN DELETE",
            r"VERSION AS OF takes a version number",
        ),
        (
            "MERGE INTO delta.`/lake/t` t USING (SELECT * FROM delta.`/lake/a` TABLESAMPLE (10 PERCENT)) s "
            "ON t.id = s.id "
            "WHEN MATCHED THEN DELETE",
            r"TABLESAMPLE is not supported",
        ),
        (
            "MERGE INTO delta.`/lake/t` VERSION AS OF 3 t USING delta.`/lake/s` s ON t.id = s.id "
            "WHEN MATCHED THEN DELETE",
            r"MERGE INTO: a merge writes the table's latest version; time travel .* reads sources only",
        ),
        ("MERGE INTO delta.`/lake/t` t USING delta.`/lake/s` s WHEN MATCHED THEN DELETE", r"MERGE needs USING and ON"),
    ],
)
def test_sql_that_would_change_meaning_is_refused(text: str, message: str) -> None:
    """Syntax the engine does not carry out is refused by name, never dropped: a merge must do what it says."""
    with pytest.raises(MergeSpecError, match=message):
        validate_spec(
            parse_merge_sql(text.format(P="MERGE INTO delta.`/lake/t` t USING delta.`/lake/s` s ON t.id = s.id"))
        )


@pytest.mark.parametrize(
    ("using", "options"),
    [
        ("delta.`/lake/s` VERSION AS OF 3", {"versionAsOf": "3"}),
        ("delta.`/lake/s` TIMESTAMP AS OF '2024-01-01 10:00:00'", {"timestampAsOf": "2024-01-01 10:00:00"}),
        ("delta.`/lake/s` TIMESTAMP AS OF TIMESTAMP '2024-01-01'", {"timestampAsOf": "2024-01-01"}),
        ("delta.`/lake/s` FOR VERSION AS OF 0", {"versionAsOf": "0"}),
    ],
)
def test_time_travel_on_a_delta_source_becomes_its_reader_options(using: str, options: dict[str, str]) -> None:
    """``VERSION AS OF`` and ``TIMESTAMP AS OF`` read the source as Delta's ``versionAsOf`` and ``timestampAsOf``
    do, whether the source is the table itself or a table its query reads."""
    direct = validate_spec(parse_merge_sql(f"MERGE INTO delta.`/lake/t` t USING {using} s ON t.id = s.id {DELETE}"))
    assert isinstance(direct.source, TableSource) and dict(direct.source.options) == options
    query = validate_spec(
        parse_merge_sql(f"MERGE INTO delta.`/lake/t` t USING (SELECT * FROM {using}) s ON t.id = s.id {DELETE}")
    )
    assert isinstance(query.source, QuerySource)
    assert [dict(r.options) for r in query.source.relations.values()] == [options]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sep": ";"}, r"source.options: a Delta source takes only versionAsOf or timestampAsOf \(time travel\), or "),
        ({"readChangeFeed": "true"}, r"\[DELTA_NO_START_FOR_CDC_READ\] No startingVersion or startingTimestamp"),
        ({"readChangeFeed": "on", "startingVersion": "1"}, r"\[DELTA_ILLEGAL_OPTION\] Invalid value 'on' for option"),
        ({"startingVersion": "1"}, r"startingVersion bounds a Change Data Feed read; set readChangeFeed to 'true'"),
        ({"readChangeFeed": "false", "endingTimestamp": "2024-01-01"}, r"endingTimestamp bounds a Change Data Feed"),
        ({"readChangeFeed": "true", "startingVersion": "3", "endingVersion": "2"}, r"\[DELTA_INVALID_CDC_RANGE\]"),
        ({"readChangeFeed": "true", "startingVersion": "-1"}, r"\[DELTA_VERSION_INVALID\] The provided version \(-1\)"),
        ({"readChangeFeed": "true", "startingVersion": "1", "endingVersion": "x"}, r"\[DELTA_VERSION_INVALID\]"),
        (
            {"readChangeFeed": "true", "startingVersion": "1", "timestampAsOf": "2024-01-01"},
            r"\[DELTA_UNSUPPORTED_TIME_TRAVEL_VIEWS\]",
        ),
        ({"versionAsOf": "1", "timestampAsOf": "2024-01-01"}, r"\[DELTA_ONEOF_IN_TIMETRAVEL\]"),
        ({"VERSIONASOF": "1", "versionasof": "2"}, r"versionAsOf is given twice \(option names ignore case\)"),
        ({"versionAsOf": "1.5"}, r"\[DELTA_TIME_TRAVEL_INVALID_BEGIN_VALUE\] versionAsOf needs to be a valid"),
        ({"versionAsOf": "x"}, r"\[DELTA_TIME_TRAVEL_INVALID_BEGIN_VALUE\]"),
    ],
)
def test_a_delta_sources_options_are_checked_not_ignored(options: dict[str, str], message: str) -> None:
    """An option a Delta source does not take is refused rather than ignored, and so is a Change Data Feed bound
    without ``readChangeFeed`` (Delta would read every row); time travel takes one version or one timestamp, a
    feed a start and a range that is not reversed."""
    with pytest.raises(MergeSpecError, match=message) as raised:
        validate_spec(spec(source=TableSource("delta", "/lake/s", options), matched=(matched(DeleteAction()),)))
    assert raised.value.field == "source.options"


@pytest.mark.parametrize(
    ("options", "read"),
    [
        ({}, DeltaRead()),
        ({"VersionAsOf": "3"}, DeltaRead(version=3)),
        ({"timestampAsOf": "2024-01-01"}, DeltaRead(timestamp="2024-01-01")),
        ({"readChangeFeed": "false", "versionAsOf": "2"}, DeltaRead(version=2)),
        (
            {"readChangeFeed": "TRUE", "startingVersion": "2", "startingTimestamp": "2024-01-01"},
            DeltaRead(change_feed=ChangeFeedRange(starting_version=2)),
        ),
        (
            {"readChangeData": "true", "startingTimestamp": "2024-01-01", "endingVersion": "9"},
            DeltaRead(change_feed=ChangeFeedRange(starting_timestamp="2024-01-01", ending_version=9)),
        ),
        (
            {"readchangefeed": "true", "startingversion": "0", "endingtimestamp": "2024-02-01"},
            DeltaRead(change_feed=ChangeFeedRange(starting_version=0, ending_timestamp="2024-02-01")),
        ),
    ],
)
def test_a_delta_sources_options_say_what_is_read(options: dict[str, str], read: DeltaRead) -> None:
    """Rows at the latest version, at an earlier one, or the Change Data Feed; a version bounds an end before a
    timestamp does, as in Delta."""
    source = TableSource("delta", "/lake/s", options)
    assert source.delta_read() == read
    assert source.reads_snapshot == (read.change_feed is None)


def test_options_of_file_sources_are_spark_reader_options() -> None:
    validate_spec(
        spec(
            source=TableSource("csv", "/lake/s.csv", {"sep": ";", "versionAsOf": "1"}),
            matched=(matched(DeleteAction()),),
        )
    )


def test_a_source_query_may_define_its_own_names_with_with() -> None:
    spec = validate_spec(
        parse_merge_sql(
            "MERGE INTO delta.`/lake/t` t USING (WITH c AS (SELECT id FROM delta.`/lake/a`) SELECT * FROM c) s "
            "ON t.id = s.id WHEN MATCHED THEN DELETE"
        )
    )
    assert isinstance(spec.source, QuerySource)
    assert list(spec.source.relations.values()) == [TableSource(format="delta", path="/lake/a")]
    assert "FROM c" in spec.source.query


def test_sql_comments_before_merge_with_schema_evolution_and_exists_lambdas() -> None:
    spec = validate_spec(
        parse_merge_sql(
            "-- nightly load\n/* owner: data */ MERGE WITH SCHEMA EVOLUTION INTO delta.`/lake/t` t "
            "USING delta.`/lake/s` s ON t.id = s.id "
            "WHEN MATCHED AND exists(s.tags, x -> x = 'vip') THEN UPDATE SET flag = exists(s.codes, c -> c > 1)"
        )
    )
    assert spec.schema_evolution
    assert spec.matched[0].condition is not None and "x -> x = 'vip'" in spec.matched[0].condition
    # EXISTS over a query is still a subquery.
    with pytest.raises(MergeSpecError, match="subqueries are not supported"):
        validate_spec(
            parse_merge_sql(
                "MERGE INTO delta.`/lake/t` t USING delta.`/lake/s` s ON t.id = s.id "
                "WHEN MATCHED AND EXISTS (SELECT 1) THEN DELETE"
            )
        )


def test_unaliased_tables_answer_to_their_names_as_in_spark() -> None:
    """Without AS, Spark qualifies a path table's columns by its name (``delta.`/p`.c`` or `` `/p`.c``); the spec
    calls the two sides ``target`` and ``source``, so those names are read as the aliases."""
    spec = validate_spec(
        parse_merge_sql(
            "MERGE INTO delta.`/lake/t` USING delta.`/lake/s` ON delta.`/lake/t`.id = delta.`/lake/s`.id "
            "WHEN MATCHED AND `/lake/s`.op = 'D' THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET delta.`/lake/t`.v = `/lake/s`.v "
            "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (delta.`/lake/s`.id, source.v)"
        )
    )
    assert (spec.target_alias, spec.source_alias, spec.on) == ("target", "source", "target.id = source.id")
    assert spec.matched[0].condition == "source.op = 'D'"
    assert spec.matched[1].action == UpdateAction(set={"target.v": "source.v"})
    assert spec.not_matched[0].action == InsertAction(values={"id": "source.id", "v": "source.v"})
    # An alias hides the table's name, as in Spark: the name is left for resolution to refuse.
    aliased = parse_merge_sql(
        "MERGE INTO delta.`/lake/t` t USING delta.`/lake/s` s ON t.id = delta.`/lake/s`.id WHEN MATCHED THEN DELETE"
    )
    assert aliased.on == "t.id = delta.`/lake/s`.id"
    # A table merged into itself without aliases stays ambiguous.
    itself = parse_merge_sql(
        "MERGE INTO delta.`/lake/t` USING delta.`/lake/t` ON `/lake/t`.id = `/lake/t`.id WHEN MATCHED THEN DELETE"
    )
    assert itself.on == "`/lake/t`.id = `/lake/t`.id"


def test_a_source_query_may_qualify_columns_by_its_tables_names() -> None:
    spec = parse_merge_sql(
        "MERGE INTO delta.`/lake/t` t USING (SELECT delta.`/lake/a`.id, `/lake/a`.v FROM delta.`/lake/a` "
        "WHERE delta.`/lake/a`.v > 1) s ON t.id = s.id WHEN MATCHED THEN DELETE"
    )
    assert isinstance(spec.source, QuerySource)
    assert spec.source.query == (
        "SELECT `/lake/a`.id, `/lake/a`.v FROM __merge_source_0 AS `/lake/a` WHERE `/lake/a`.v > 1"
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"on": "t.id = s.id AND rand() > 0.5", "matched": (matched(DeleteAction()),)}, "on"),
        ({"matched": (matched(DeleteAction(), "t.id IN (SELECT 1)"),)}, "when_matched[0].condition"),
        ({"matched": (matched(UpdateAction(set={"v": "upper("})),)}, "when_matched[0].set.v"),
        ({"matched": (matched(UpdateAction(set={"v": "s.v", "t.v": "s.v"})),)}, "when_matched[0].set"),
        (
            {"not_matched": (MergeClause("notMatched", InsertAction(values={"id": "t.id"})),)},
            "when_not_matched[0].values.id",
        ),
        ({"matched": (matched(DeleteAction()),), "source": QuerySource(query="SELECT * FROM other")}, "source.query"),
    ],
)
def test_a_spec_error_carries_the_field_its_message_names(kwargs: dict[str, object], field: str) -> None:
    """Callers read the field at fault from the error, never out of its message."""
    with pytest.raises(MergeSpecError) as info:
        validate_spec(spec(**kwargs))
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_a_sql_error_carries_the_sql_field() -> None:
    with pytest.raises(MergeSpecError) as info:
        parse_merge_sql("SELECT 1")
    assert info.value.field == "sql"


def test_an_auto_cdc_batchs_delta_source_takes_the_same_options() -> None:
    batch = AutoCdcSpec(
        target="/lake/t",
        source=TableSource("delta", "/lake/changes", {"readChangeFeed": "true"}),
        keys=("id",),
        sequence_by=("seq",),
    )
    with pytest.raises(MergeSpecError, match="DELTA_NO_START_FOR_CDC_READ") as raised:
        validate_auto_cdc(batch)
    assert raised.value.field == "source.options"
    for options in ({"versionAsOf": "7"}, {"readChangeFeed": "true", "startingVersion": "7"}):
        validate_auto_cdc(dataclasses.replace(batch, source=TableSource("delta", "/lake/changes", options)))


@pytest.mark.parametrize("value", ["(SELECT 'z')", "1 + (SELECT 2)", "(SELECT max(id) FROM delta.`/lake/other`)"])
def test_a_subquery_as_a_value_is_refused_saying_so(value: str) -> None:
    """Delta's MERGE would run an uncorrelated scalar subquery; the engine reads other tables only through the
    source query, where each path is checked and read as a Delta table, and says so."""
    with pytest.raises(
        MergeSpecError, match=r"when_matched\[0\]\.set\.v: subqueries are not supported .*\(USING \(SELECT"
    ):
        validate_spec(spec(matched=(matched(UpdateAction(set={"v": value})),)))
