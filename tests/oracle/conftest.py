"""Delta on Spark as the oracle: the fixtures of tests/oracle/fixtures.py for the tests here."""

from tests.oracle.fixtures import delta_spark, delta_spark_server

__all__ = ["delta_spark", "delta_spark_server"]
