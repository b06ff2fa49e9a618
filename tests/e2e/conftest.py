"""The end-to-end tests use the service tests' PostgreSQL server where the job database must be production's, and
Delta on Spark (tests/oracle) where a job runs as Delta's own MERGE."""

from tests.oracle.fixtures import delta_spark, delta_spark_server
from tests.service.conftest import postgres_server

__all__ = ["delta_spark", "delta_spark_server", "postgres_server"]
