"""Which numeric store assignments get the overflow check that names the column: exactly those where some value of
the source type does not fit the target type, as Spark's own ANSI cast decides."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import DataType, DecimalType
from pyspark.sql.types import _parse_datatype_string as parse_type

from engine.store_assignment import may_overflow

TYPES = [
    "tinyint",
    "smallint",
    "int",
    "bigint",
    "float",
    "double",
    "decimal(3,0)",
    "decimal(4,1)",
    "decimal(5,2)",
    "decimal(10,0)",
    "decimal(19,0)",
    "decimal(20,0)",
    "decimal(38,10)",
]
EXTREMES = {
    "tinyint": ["-128", "127"],
    "smallint": ["-32768", "32767"],
    "int": ["-2147483648", "2147483647"],
    "bigint": ["-9223372036854775808", "9223372036854775807"],
    "float": ["-3.4028235E38", "3.4028235E38", "NaN"],
    "double": ["-1.7976931348623157E308", "1.7976931348623157E308", "NaN"],
}


def _extremes(name: str, dtype: DataType) -> list[str]:
    if isinstance(dtype, DecimalType):
        digits = "9" * (dtype.precision - dtype.scale) or "0"
        fraction = f".{'9' * dtype.scale}" if dtype.scale else ""
        return [f"-{digits}{fraction}", f"{digits}{fraction}"]
    return EXTREMES[name]


def test_the_check_goes_exactly_where_spark_can_overflow(spark: SparkSession) -> None:
    pairs = [(s, t) for s in TYPES for t in TYPES if s != t]
    checks = []
    for source, target in pairs:
        values = _extremes(source, parse_type(source))
        checks.append(" OR ".join(f"try_cast(CAST('{v}' AS {source}) AS {target}) IS NULL" for v in values) or "false")
    row = spark.sql("SELECT " + ", ".join(f"({c}) AS c{i}" for i, c in enumerate(checks))).collect()[0]
    spark_overflows = {pair: bool(row[i]) for i, pair in enumerate(pairs)}
    ours = {(s, t): may_overflow(parse_type(s), parse_type(t)) for s, t in pairs}
    assert ours == spark_overflows
