# tidemq developer commands. Every target creates the virtual environment when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
CKSUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
# Everything (dev tools, Spark, server) for test/check/bench; only the server for run.
STAMP := $(VENV)/.installed-$(CKSUM)
SERVER_STAMP := $(VENV)/.installed-server-$(CKSUM)

.PHONY: run test check java chromium etcd format bench soak clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,server]'
	rm -f $(VENV)/.installed-*
	touch $@ $(SERVER_STAMP)

# `make run` installs what the server needs only: tidemq with its `server` extra (uvloop).
$(SERVER_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server]'
	rm -f $(VENV)/.installed-server-*
	touch $@

venv: $(STAMP)

run: $(SERVER_STAMP)
	$(VENV)/bin/tidemq server --data-dir ./data --set tiered.url=file://$(CURDIR)/tier

check: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The Spark tests (marker `spark`) need Java 17+: installed with apt-get when missing.
java:
	sh scripts/ensure-java.sh

# The web console's browser tests drive Debian's chromium (apt-get when missing).
chromium:
	sh scripts/ensure-chromium.sh

# The replication tests start real etcd processes: Debian's etcd-server (apt-get when missing).
etcd:
	sh scripts/ensure-etcd.sh

# Two workers: most tests wait on servers, sleeps and subprocesses, so two share the two
# cores well (13 min serial, 8 min on two). The Spark tests all go to one worker (one JVM).
# Every test's time goes to $(VENV)/test-times.xml (JUnit XML), to see where the budget goes.
test: check java chromium etcd
	$(VENV)/bin/pytest -W error -q -n 2 --dist loadgroup --durations=25 --junit-xml=$(VENV)/test-times.xml

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

# The benchmarks' peers: redis-py and nats-py (the `bench` extra) in the venv, and
# redis-server and nats-server from apt-get when missing (scripts/ensure-bench-peers.sh).
# Without apt-get that script fails with a message and the benchmarks report the peer missing.
BENCH_STAMP := $(VENV)/.installed-bench-$(CKSUM)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

bench: $(STAMP) $(BENCH_STAMP)
	-sh scripts/ensure-bench-peers.sh
	$(PY) benchmarks/bench_send_one.py --json benchmarks/results/send_one-async.json
	$(PY) benchmarks/bench_send_one.py --flush sync --runs 3 --json benchmarks/results/send_one-sync.json
	$(PY) benchmarks/bench_codec.py
	$(PY) benchmarks/bench_store.py
	$(PY) benchmarks/bench_checkpoint.py
	$(PY) benchmarks/bench_broker.py
	$(PY) benchmarks/bench_scale.py
	$(PY) benchmarks/bench_replication.py
	$(PY) benchmarks/bench_special.py
	$(PY) benchmarks/bench_pop.py
	$(PY) benchmarks/bench_spark.py
	$(PY) benchmarks/bench_compaction.py --json benchmarks/results/compaction.json
	$(PY) benchmarks/bench_static_remap.py --json benchmarks/results/static_remap.json
	$(PY) benchmarks/bench_metrics.py --runs 6 --json benchmarks/results/metrics.json
	$(PY) benchmarks/bench_topics.py --json benchmarks/results/topics.json
	$(PY) benchmarks/bench_key_index.py --json benchmarks/results/key_index.json
	$(PY) benchmarks/bench_serde.py --json benchmarks/results/serde.json
	$(PY) benchmarks/bench_spark_value_format.py --json benchmarks/results/spark_value_format.json
	$(PY) benchmarks/bench_tier.py --json benchmarks/results/tier.json
	$(PY) benchmarks/bench_tier_disk.py --json benchmarks/results/tier_disk.json
	$(PY) benchmarks/bench_spark_tier.py --json benchmarks/results/spark_tier.json
	$(PY) benchmarks/bench_pipeline_analytics.py --json benchmarks/results/pipeline_analytics.json
	$(PY) benchmarks/bench_pipeline_archive.py --json benchmarks/results/pipeline_archive.json

soak: $(STAMP)
	TIDEMQ_SOAK=1 $(VENV)/bin/pytest -W error -q -m "slow" tests/simulation tests/integration
	TIDEMQ_SOAK=1 $(VENV)/bin/pytest -W error -q tests/spark/test_pipeline_worker_kill9.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
