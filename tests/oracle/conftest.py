"""Delta on Spark as the oracle: the ``delta_spark`` fixtures (tests/oracle/fixtures.py) come from the root conftest,
so that one Delta server serves the whole run."""
