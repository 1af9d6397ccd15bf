# t2t-lite: every target installs into .venv first (once; again only when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The main job: Multi30k English-German on the CPU.
MULTI30K_DIR ?= $(if $(wildcard ../shared/data/multi30k/train.en.gz),../shared/data/multi30k,)
TRAIN_MINUTES ?= 25
RUN_DIR ?= runs/multi30k_ende
DATA_DIR ?= data/multi30k_ende

.PHONY: install test train bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Two processes, whole files each (module fixtures are built once); TEST_JOBS=0 runs serially.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest tests $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

train: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" MULTI30K_DIR="$(MULTI30K_DIR)" \
	  bash data_scripts/multi30k_ende.sh "$(DATA_DIR)" "$(RUN_DIR)" "$(TRAIN_MINUTES)"

bench: $(STAMP)
	$(BIN)/python -m t2t_lite.bench --out_dir bench_out

clean:
	rm -rf $(VENV) runs data bench_out
