# The two commands of the README.  Everything they need is installed here:
# a virtualenv with the package and its test and docs extras (pytest, ruff, mypy, selenium,
# mkdocs); Debian's chromium and chromedriver for the UI's browser test; Debian's promtool
# for the tests of docker/'s alert rules; the local runtime
# (Kafka, S3 server, connector jars) is fetched by `spark-abs local up` on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FLINK_VERSION := 2.2.1
QUIX_VERSION  := 3.28.1
PEERS  := .venv-flink/.installed .venv-quix/.installed
BROWSER := /usr/bin/chromedriver
PROMTOOL := /usr/bin/promtool
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test install clean bench bench-quick docs

run: $(STAMP)
	$(BIN)/spark-abs demo

test: $(STAMP) $(BROWSER) $(PROMTOOL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(BIN)/python -m pytest -m "not integration" -n auto --maxprocesses 4
	$(BIN)/python -m pytest -m integration

# the documentation site (docs/, mkdocs.yml) served at http://127.0.0.1:8000
docs: $(STAMP)
	$(BIN)/mkdocs serve

install: $(STAMP)

# spark-abs against plain Spark, Flink SQL and Quix Streams, side by side (benchmarks/):
# results under $SPARK_ABS_HOME/bench/
bench: $(STAMP) $(VENV)/.bench $(PEERS)
	$(BIN)/python -m benchmarks --demo --profile

bench-quick: $(STAMP) $(VENV)/.bench $(PEERS)
	$(BIN)/python -m benchmarks --quick --demo --profile

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,docs,bench]'
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
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

# headless Chromium and its driver from Debian's packages (a browser that downloads itself cannot)
$(BROWSER):
	$(SUDO) apt-get install -y -q chromium chromium-driver \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver)

# promtool, which checks and unit-tests Prometheus rules, from Debian's prometheus package (no
# server is started)
$(PROMTOOL):
	$(SUDO) apt-get install -y -q --no-install-recommends prometheus \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends prometheus)

clean:
	-$(BIN)/spark-abs local down
	rm -rf $(VENV) .venv-flink .venv-quix .pytest_cache .hypothesis .mypy_cache
