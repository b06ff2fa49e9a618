"""The end-to-end tests use the service tests' PostgreSQL server where the job database must be production's."""

from tests.service.conftest import postgres_server

__all__ = ["postgres_server"]
