# The README's commands. Everything runs from a virtualenv the Makefile creates.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The suite runs in two processes side by side (pytest-xdist), a test file to each at a time, in the order of
# their paths: the long deployment and fault tests start first, and the many short files fill in around them.
TEST_PROCESSES ?= 2

.PHONY: run test lint bench clean check-java delta-spark compose-check

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "merge-service needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "merge-service needs Java 17 or newer on PATH (Spark runs on it): install a JDK, e.g. 'apt-get install openjdk-17-jre-headless'." >&2; exit 1; }

run: $(STAMP) check-java
	$(BIN)/merge-service migrate
	$(BIN)/merge-service serve

test: $(STAMP) check-java
	$(BIN)/ruff check engine service tests bench
	$(BIN)/ruff format --check engine service tests bench
	$(BIN)/mypy engine service
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(BIN)/ruff check engine service tests bench
	$(BIN)/ruff format --check engine service tests bench
	$(BIN)/mypy engine service

bench: $(STAMP) check-java
	$(BIN)/python bench/merge_bench.py

# The deployment end to end (docker-compose.yml): needs dockerd (run as root, it installs and starts one when none
# answers); builds stand-ins for the base images when no registry is reachable. See deploy/test/compose_check.py.
compose-check: $(STAMP)
	$(BIN)/python deploy/test/compose_check.py --start-dockerd

# Delta on Spark for the oracle tests (tests/oracle): the pyspark wheel Delta supports and Delta's jars from Maven
# Central, once, into ~/.cache/merge-service/delta-spark (MERGE_DELTA_SPARK_CACHE moves it).
delta-spark: $(STAMP) check-java
	$(BIN)/python -m tests.oracle.delta_spark

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
