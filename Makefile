# The two commands of the README.  Everything they need is installed here:
# a virtualenv with the package and its test extras (pytest, ruff); the local runtime
# (Kafka, S3 server, connector jars) is fetched by `spark-abs local up` on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FLINK_VERSION := 2.2.1
QUIX_VERSION  := 3.28.1
PEERS  := .venv-flink/.installed .venv-quix/.installed

.PHONY: run test install clean bench bench-quick

run: $(STAMP)
	$(BIN)/spark-abs demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

install: $(STAMP)

# spark-abs against plain Spark, Flink SQL and Quix Streams, side by side (benchmarks/):
# results under $SPARK_ABS_HOME/bench/
bench: $(STAMP) $(VENV)/.bench $(PEERS)
	$(BIN)/python -m benchmarks --demo --profile

bench-quick: $(STAMP) $(VENV)/.bench $(PEERS)
	$(BIN)/python -m benchmarks --quick --demo --profile

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(VENV)/.bench

# the peers, each in a virtualenv of its own: PyFlink pins py4j, pandas and pyarrow below pyspark's
.venv-flink/.installed:
	$(PYTHON) -m venv .venv-flink
	.venv-flink/bin/python -m pip install --quiet 'apache-flink==$(FLINK_VERSION)'
	touch $@

.venv-quix/.installed:
	$(PYTHON) -m venv .venv-quix
	.venv-quix/bin/python -m pip install --quiet 'quixstreams==$(QUIX_VERSION)'
	touch $@

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

clean:
	-$(BIN)/spark-abs local down
	rm -rf $(VENV) .venv-flink .venv-quix .pytest_cache .hypothesis
