# exaplan: `make demo` runs the main job, `make test` runs the tests. Both build .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# CPU build of torch that lies on this kind of machine; never an unpinned torch.
TORCH   ?= torch==2.13.0

.PHONY: venv demo test test-all bench bench-local plans clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q '$(TORCH)'
	$(BIN)/python -m pip install -q -e '.[dev,plot,runtime]'
	touch $(STAMP)

# The main job: plan protein-3.5b for the five seed systems, then plan protein-small for
# this machine and train it on the shipped UniProt sample on 2 ranks.
DEMO_STEPS ?= 200
demo: venv
	$(BIN)/python -m planner.demo
	rm -rf runs/demo && mkdir -p runs/demo
	$(BIN)/exaplan plan --model protein-small --machine local --global-batch 4 --seq-len 128 --top 3 -o runs/demo/plan.yaml
	$(BIN)/exaplan run runs/demo/plan.yaml --steps $(DEMO_STEPS) --out runs/demo --log-every 20 --val-every 50

test: venv
	$(BIN)/python -m pytest -q -m "not slow"

test-all: venv
	$(BIN)/python -m pytest -q

bench: venv
	$(BIN)/python -m planner.bench

# Issue-4 targets on this machine (median |step error| <= 10%, Spearman >= 0.9, first choice
# within 5% of the fastest, memory error <= 15%): 12 layouts through `exaplan run`, 2 rounds.
# About 15 minutes on 2 cores; run it on an otherwise idle machine.
BENCH_LOCAL_MACHINE ?= local
bench-local: venv
	$(BIN)/exaplan validate --local --machine $(BENCH_LOCAL_MACHINE) --steps 10 --repeats 2 --out runs/bench-local

plans: venv
	$(BIN)/python -m cli.examples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
