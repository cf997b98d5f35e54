# Brook's developer entry points. Every target bootstraps its own virtualenv, so a
# fresh machine with Python 3.11+ (and Java 17+ for Spark) needs nothing else.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv wheel test test-fast demo proto lint soak fuzz sim chaos chaos-txn bench bench-storage bench-codec bench-metadata bench-client bench-txn bench-spark bench-peer clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev,spark]'
	@touch $(STAMP)

## A wheel of this checkout in dist/ (what deploy/systemd installs; PyPI's "brook" is another project).
wheel: venv
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls dist/brook-*.whl

## The whole test suite (what CI runs).
test: venv
	$(PY) -m pytest -q tests -n 3 --dist loadscope --no-loadscope-reorder --durations=25

## Unit and in-process tests only (no multi-process clusters, no Spark): about 3 minutes, for the edit loop.
test-fast: venv
	$(PY) -m pytest -q tests -n 2 --dist loadscope --no-loadscope-reorder -m 'not slow and not spark'

## Local 3-node cluster + topic + produce + Spark streaming job over it.
demo: venv
	$(PY) -m deploy.local.demo

## Regenerate the Python gRPC modules from proto/*.proto.
proto: venv
	$(PY) -m proto.generate

lint: venv
	$(PY) -m ruff check .

## Deterministic simulator, long run (the suite runs 1000 seeds): make sim SIM_SEEDS=100000 SIM_JOBS=2
SIM_SEEDS ?= 100000
SIM_JOBS  ?= 1
SIM_ARGS  ?=
sim: venv
	$(PY) -m tests.sim.run --seeds $(SIM_SEEDS) --jobs $(SIM_JOBS) $(SIM_ARGS)

## Long soak / chaos runs, kept out of the suite.
soak: venv
	$(PY) -m pytest -q tests -m soak -p no:cacheprovider -o addopts=''

## Coverage-guided fuzzing (atheris) of the batch parser, the record validator, the broker's and
## controller's RPC handlers and the Kafka listener's request path: FUZZ_SECONDS per target (default 20), FUZZ_RUNS, FUZZ_TARGETS to change it.
fuzz: venv
	$(PY) tests/fuzz/run.py

## Randomized fault run (tests/chaos): a 3-node cluster under idempotent acks=all writers while a
## seeded nemesis kills, stops and partitions nodes; one summary line, non-zero exit on a violation.
## CHAOS_DURATION (seconds of faults), CHAOS_SEED (replays a schedule; default: the clock),
## CHAOS_ARGS (more flags, see `python -m tests.chaos.run --help`). Then the simulator (`make sim`).
CHAOS_DURATION ?= 600
CHAOS_SEED ?= $(shell date +%s)
CHAOS_ARGS ?=
chaos: venv
	$(PY) -m tests.chaos.run --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) $(CHAOS_ARGS)
	$(MAKE) sim

## Transactions under faults (tests/chaos/transactions.py): a librdkafka transactional producer commits and aborts
## while brokers are killed and frozen; then every committed transaction must be read whole and once, no aborted one.
chaos-txn: venv
	$(PY) -m tests.chaos.transactions --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED)

bench-storage: venv
	$(PY) -m storage.perf

bench-metadata: venv
	$(PY) -m metadata_quorum.bench

bench-codec: venv
	$(PY) -m storage.codec_bench
	$(PY) -m broker.kafka_wire.bench

## Producer/consumer throughput and latency on a fresh local 3-node cluster (RF 3).
bench-client: venv
	$(PY) -m deploy.local.bench

## Spark streaming read into a noop sink on a fresh local 3-node cluster.
bench-spark: venv
	$(PY) -m spark_source.bench

## Transactions a second a local 3-node cluster commits (librdkafka transactional producers), commit latency.
bench-txn: venv
	$(PY) -m deploy.local.txn_bench

## Brook next to NATS JetStream (3 servers, R3 file stream; nats-server from apt), same records, one run.
bench-peer: venv
	$(PY) -m deploy.local.peer_bench

## Every benchmark, one after the other.
bench: bench-codec bench-storage bench-metadata bench-client bench-txn bench-spark bench-peer

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
