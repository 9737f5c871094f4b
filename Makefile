# The two set-up commands of the README, and their parts.
#   make demo   - install, start the local stack, run the main job
#   make test   - install, start the local stack, run every test
# Each step is idempotent: a second run reuses the virtualenv and the running stack.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: venv jvm stack test drills demo down lint docs clean

venv: jvm $(VENV)/.installed

# The snapshot lookups of the stream job's real-time mode (stream.mode: realtime) run in the JVM: a small
# Java component (stream_app/jvm, Java 17, Maven; its unit tests run in the build) packaged as
# stream_app/jars/threes-lookup.jar, which ships in the wheel and reaches the executors through spark.jars.
# Maven's repository is the project-local one of the local stack (.threes/m2).
LOOKUP_JAR := stream_app/jars/threes-lookup.jar
M2         ?= $(CURDIR)/.threes/m2
JVM_LOG    ?= .threes/logs/maven-threes-lookup.log
MVN_FLAGS  ?=

jvm: $(LOOKUP_JAR)

$(LOOKUP_JAR): stream_app/jvm/pom.xml $(shell find stream_app/jvm/src -name '*.java' 2>/dev/null)
	@command -v mvn >/dev/null || { echo "make jvm: Maven (mvn) is not installed: apt-get install -y maven (and a JDK 17)" >&2; exit 1; }
	@mkdir -p $(dir $(JVM_LOG)) $(dir $@)
	@echo "make jvm: building the Java lookup component (stream_app/jvm) with Maven, log in $(JVM_LOG)"
	@mvn -B -Dstyle.color=never -Dmaven.repo.local=$(M2) $(MVN_FLAGS) -f stream_app/jvm/pom.xml package >$(JVM_LOG) 2>&1 || { \
	  echo "make jvm: FAILED to build the Java lookup component of stream.mode realtime (stream_app/jvm); Maven said:" >&2; \
	  grep -E "ERROR|FAIL|Tests run:.*Fail" $(JVM_LOG) | head -n 20 >&2; \
	  echo "make jvm: full log: $(JVM_LOG)" >&2; exit 1; }
	cp stream_app/jvm/target/threes-lookup.jar $@

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "threes needs Python >= 3.11 (found %s); set PYTHON=python3.11" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -e '.[dev,mysql,demo,iceberg]'
	touch $@

stack: venv
	$(BIN)/threes local up

# Two pytest-xdist workers (a module's tests stay together; tests/conftest.py), then the tests that stop
# shared services (marked serial) alone.
TEST_WORKERS ?= 2

# Static checks first (mypy, [tool.mypy]; ruff; the layering contracts of pyproject.toml's [tool.importlinter]),
# then the tests.
test: lint stack
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	$(BIN)/pytest -m serial

# The failure drills at the sizes their issues name (make test runs them shorter): 90 s outages of
# PostgreSQL, Elasticsearch and the Kafka broker, 10 kill -9 of a polling, a CDC and an exactly-once
# source, 5 kill -9 of a MySQL/MariaDB binlog CDC source over 20,000 operations, 20 kills of a sync
# service over 50,000 updates, a sink table without privileges or a column for 20 s under 3,000 updates, SIGTERM during every retry loop, kill -9 of threes run, kill -9 of a
# partition leader of a three-broker cluster under the sync service, an exactly-once snapshot, a CDC stream and
# the stream job in micro-batch and real-time mode, and 10 kills of the Iceberg sink's sync service over 50,000 updates.
drills: stack
	THREES_OUTAGE_S=90 THREES_KAFKA_OUTAGE_S=90 THREES_KILL9_KILLS=10 THREES_CDC_KILLS=10 THREES_EOS_KILLS=10 \
	THREES_SOAK_UPDATES=50000 THREES_SOAK_KILLS=20 THREES_BLOCKED_TARGET_S=20 THREES_BLAST_RECORDS=3000 \
	THREES_FAILOVER_UPDATES=60000 THREES_FAILOVER_ROWS=200000 THREES_FAILOVER_LOAD_S=60 \
	THREES_ICEBERG_SOAK_UPDATES=50000 THREES_ICEBERG_SOAK_KILLS=10 \
	THREES_BINLOG_KILLS=5 THREES_BINLOG_OPS=20000 \
	$(BIN)/pytest tests/integration/ops/test_outage.py tests/integration/sources/test_rds_kill9.py \
	  tests/integration/sources/test_rds_cdc_kill9.py tests/integration/sources/test_rds_cdc_mysql_kill9.py \
	  tests/integration/sources/test_exactly_once.py \
	  tests/integration/sync/test_kill9.py tests/e2e/test_kafka_restart.py tests/integration/sync/test_blast_radius.py \
	  tests/integration/ops/test_stops.py tests/integration/pipeline/test_run_lock.py \
	  tests/integration/ops/test_leader_failover.py tests/integration/ops/test_leader_failover_realtime.py \
	  tests/integration/sync/test_iceberg_kill9.py

demo: stack
	$(BIN)/threes demo

down:
	$(BIN)/threes local down

docs: venv
	$(BIN)/threes docs -o docs/config-reference.md

lint: venv
	$(BIN)/mypy
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean: down
	rm -rf $(VENV) .threes
