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
# Pieces of the joint sentencepiece vocabulary that DATA_DIR is made with, and the sampled
# segmentations of every training pair beside the one best (0: none; SUBWORD_SAMPLING_ALPHA:
# 0.3 unless set; data_scripts/multi30k_data.sh). The demo's set reads them from update 101
# in a run the time budget makes at least 1,800 updates long.
VOCAB_SIZE ?= 12000
SUBWORD_SAMPLING_COPIES ?= 16
SUBWORD_SAMPLING_ALPHA ?=
DATA_ENV = MULTI30K_DIR="$(MULTI30K_DIR)" VOCAB_SIZE="$(VOCAB_SIZE)" \
  SUBWORD_SAMPLING_COPIES="$(SUBWORD_SAMPLING_COPIES)" SUBWORD_SAMPLING_ALPHA="$(SUBWORD_SAMPLING_ALPHA)"

.PHONY: install test train bench bench-fairseq clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The linter, then the tests in two processes, whole files each (module fixtures are built
# once), in the order tests/conftest.py gives them (longest first; without
# --no-loadscope-reorder pytest-xdist hands out the files with the most tests first, which
# left the longest ones to the end); TEST_JOBS=0 runs them serially.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/ruff check --no-cache .
	if [ "$$(id -u)" = 0 ]; then bash data_scripts/slurm_local_up.sh || exit 1; export T2T_LITE_SLURM_EXPECTED=1; fi; \
	$(BIN)/python -m pytest tests $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder)

train: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(DATA_ENV) \
	  bash data_scripts/multi30k_ende.sh "$(DATA_DIR)" "$(RUN_DIR)" "$(TRAIN_MINUTES)"

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run --out_dir bench_out --data_dir="$(DATA_DIR)"

# Training speed and peak RSS against fairseq on the same pieces, model and batch size.
# fairseq is not a dependency: FAIRSEQ_BIN is the bin/ folder of an environment that has it
# (data_scripts/fairseq_env.sh DIR makes one); DATA_DIR is prepared as by `make train`.
FAIRSEQ_BIN ?=
FAIRSEQ_ROUNDS ?= 3
# native, or the instruction set to cap both programs' kernels at: avx2, avx512_core,
# avx512_core_bf16 (what a CPU with only that set would run).
FAIRSEQ_ISA ?= native
bench-fairseq: $(STAMP)
	@test -n "$(FAIRSEQ_BIN)" || { echo "make bench-fairseq: set FAIRSEQ_BIN=DIR/bin, an environment with fairseq (data_scripts/fairseq_env.sh DIR makes one)" >&2; exit 2; }
	PATH="$(CURDIR)/$(BIN):$$PATH" $(DATA_ENV) \
	  bash data_scripts/multi30k_data.sh "$(DATA_DIR)"
	$(BIN)/python -m benchmarks.fairseq --fairseq_bin="$(FAIRSEQ_BIN)" --data_dir="$(DATA_DIR)" \
	  --out_dir=bench_out --rounds=$(FAIRSEQ_ROUNDS) --isa=$(FAIRSEQ_ISA)

clean:
	rm -rf $(VENV) runs data bench_out
