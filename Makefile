# exaplan: `make demo` runs the main job, `make test` runs the tests (`make test-slurm`: the job scripts under a real Slurm). Both build .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# CPU build of torch that lies on this kind of machine; never an unpinned torch.
TORCH   ?= torch==2.13.0

.PHONY: venv demo test test-all test-slurm slurm-packages docs docs-serve bench bench-runtime bench-jax bench-gpu bench-gpu-jax bench-gpu-kernels bench-local plans clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q '$(TORCH)'
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,plot,runtime,jax,frameworks]'
	# Megatron-LM's training package and MaxText ship Python 3.12 wheels only: their pure-Python
	# sources unpacked under .venv/frameworks/ for exaplan export --check (docs/frameworks/).
	$(BIN)/python -m export.fetch_megatron
	$(BIN)/python -m export.fetch_maxtext
	# DeepSpeed's CPU shared-memory op, built once here rather than in the first test
	DS_ACCELERATOR=cpu $(BIN)/python -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
	touch $(STAMP)

# The main job: plan protein-3.5b for the five seed systems and check the Aurora plan's first and
# last rank at its full size (38,400 ranks on a fake process group, about 30 s); then calibrate this machine on
# arrival (its CPU differs from one VM to the next: microbenchmarks, 4 layouts of protein-small
# trained 8 steps each, the figures refitted to them; about 75 s), plan protein-small on the
# fitted figures (the search picks a layout the sweep did not run) and train it on the shipped
# UniProt sample on 2 ranks: measured against predicted.
DEMO_STEPS ?= 200
demo: venv
	$(BIN)/python -m planner.demo
	$(BIN)/exaplan check plans/protein-3.5b_aurora_3200n.yaml --ranks first,last
	rm -rf runs/demo && mkdir -p runs/demo
	$(BIN)/exaplan calibrate --arrival --quick --out runs/demo/calib
	$(BIN)/exaplan plan --model protein-small --machine runs/demo/calib/fitted.yaml --global-batch 4 --seq-len 128 --top 3 -o runs/demo/plan.yaml
	$(BIN)/exaplan run runs/demo/plan.yaml --steps $(DEMO_STEPS) --out runs/demo --log-every 20 --val-every 50

# `make test` runs on TEST_WORKERS processes (pytest-xdist; the longest tests, DPO's learning
# check and the multi-rank runs, spread over them): 9.5 min on this 2-core machine against 14
# serially. Each rank of a multi-rank test still takes its share of the cores; TEST_WORKERS=0
# runs serially. `make test-all` stays serial: its slow multi-rank runs time walltime signals.
TEST_WORKERS ?= 2
test: venv docs
	$(BIN)/python -m pytest -q -m "not slow" $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# `make test-slurm`: exaplan's own Slurm job scripts under a real Slurm (tests/slurm/): a private
# slurmctld, two slurmd and munged started for the session in a temporary folder (nothing of the
# system's Slurm used), sbatch of protein-tiny runs on the local machine. Installs Debian's Slurm
# (slurm-wlm slurmctld slurmd munge) first where it is missing, when run as root with apt-get.
# About 8 minutes on 2 cores (the staging test packs and sbcasts the whole .venv).
SLURM_PACKAGES := slurm-wlm slurmctld slurmd munge
test-slurm: venv slurm-packages
	EXAPLAN_SLURM=1 $(BIN)/python -m pytest -q tests/slurm

# Debian's Slurm and munge, where one of their commands is missing (root and apt-get needed).
slurm-packages:
	@if ! command -v sbatch >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES); \
		else echo "make slurm-packages: needs Slurm ($(SLURM_PACKAGES)) installed, or root and apt-get" >&2; exit 1; fi; fi

# The documentation site (docs/, mkdocs.yml; MkDocs with the Material theme): `make docs` builds it
# into site/ with --strict (a broken link, a missing page or a failing generator fails the build);
# `make test` builds it first. `make docs-serve` serves it on localhost:8000 while you edit.
MKDOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: venv
	$(MKDOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: venv
	$(MKDOCS_ENV) $(BIN)/mkdocs serve

# The fuzz tests (tests/fuzz) run 25 examples each with a fixed seed in `make test`, and
# EXAPLAN_FUZZ_DEEP examples each with a fresh seed in `make test-all`.
EXAPLAN_FUZZ_DEEP ?= 300
test-all: venv
	EXAPLAN_FUZZ=deep EXAPLAN_FUZZ_DEEP=$(EXAPLAN_FUZZ_DEEP) $(BIN)/python -m pytest -q

# Search speed, then the what-if sweep (in process: the planner's share) and the whole
# `exaplan whatif ... --report` command (target 2.5 s on a 2-core machine, report included);
# `exaplan check` of the Aurora plan's first and last rank (target under a minute a rank; a
# rank that disagrees with the planner exits 1, recorded all the same: the leading -);
# then bench-runtime and bench-jax. Each benchmark's results (the machine as detected, the
# date, the command, the figures) go to docs/results/bench-*.json through benchmarks/record.py
# (RECORD), the latest run of each, which the docs site's "Benchmark results" page renders.
RECORD = $(BIN)/python -m benchmarks.record
bench: venv
	$(RECORD) search --out docs/results/bench-search.json -- $(BIN)/python -m planner.bench --json
	$(RECORD) commands --out docs/results/bench-commands.json -- $(BIN)/python -m planner.bench --commands --json \
		--repeats 5
	$(RECORD) whatif --out docs/results/bench-whatif.json -- $(BIN)/python -m planner.bench --whatif --json \
		--report-dir runs/bench-whatif
	-$(RECORD) check --out docs/results/bench-check.json -- $(BIN)/exaplan check plans/protein-3.5b_aurora_3200n.yaml \
		--ranks first,last --json
	$(MAKE) bench-runtime
	$(MAKE) bench-jax

# `exaplan run` against hand-written torch loops of the same layouts (ddp, fsdp, zero1, tp_sp,
# pp_1f1b; benchmarks/): 3 interleaved rounds x 30 steps each, about 13 minutes on 2 cores; run
# it on an otherwise idle machine. Results: runs/bench-runtime/results.{md,json}, recorded in
# docs/results/bench-runtime.json.
bench-runtime: venv
	$(RECORD) runtime --out docs/results/bench-runtime.json --figures runs/bench-runtime/results.json -- \
		$(BIN)/python -m benchmarks.runtime_vs_torch --out runs/bench-runtime

# `exaplan run --backend jax` beside `--backend torch` on the demo's job (benchmarks/jax_vs_torch.py):
# the demo's plan (torch; JAX runs the same command's --backend jax plan, as it runs no pipeline) in
# 3 interleaved rounds x 30 steps, then one round each of that JAX plan, fsdp and tp2 on both. About
# 6 minutes on 2 cores; run it on an otherwise idle machine. Results: runs/bench-jax/results.{md,json},
# recorded in docs/results/bench-jax.json.
bench-jax: venv
	$(RECORD) jax --out docs/results/bench-jax.json --figures runs/bench-jax/results.json -- \
		$(BIN)/python -m benchmarks.jax_vs_torch --out runs/bench-jax

# On a GPU machine (not part of `make bench`: it needs CUDA; a GPU build of torch, e.g.
# `make TORCH=torch==X.Y bench-gpu`): the card's ceilings, its attention kernel, and `exaplan run`
# against a plain-torch loop on plans/gpu/ (the demo's workload and protein-3.5b in bf16), MFU
# measured against predicted; add GPU_CHECK_ARGS=--compile for compiled blocks. A few minutes.
# Results: runs/bench-gpu/gpu_check.{md,json}, recorded in docs/results/bench-gpu.json.
GPU_CHECK_ARGS ?=
bench-gpu: venv
	$(RECORD) gpu --out docs/results/bench-gpu.json --figures runs/bench-gpu/gpu_check.json -- \
		$(BIN)/python -m benchmarks.gpu_check --out runs/bench-gpu $(GPU_CHECK_ARGS)

# On a GPU machine too, the JAX backend: the JAX twins of the H100 plans (docs/validation/gpu.md,
# "The JAX backend on a GPU"), measured against predicted. Needs JAX's CUDA plugin of the `jax` extra's version in
# .venv (e.g. `.venv/bin/pip install "jax[cuda13]==0.10.2"`). About 15 minutes, mostly XLA compiling.
JAX_GPU_PLANS = $(subst $(space),$(comma),$(addprefix plans/gpu/,protein-3.5b_1xh100_jax.yaml \
	protein-3.5b_1xh100_jax_mbs8.yaml protein-1.2b-h2048_1xh100_s4096_jax.yaml \
	protein-1.2b-h2048_1xh100_s8192_jax.yaml protein-0.3b-h1024_1xh100_s2048_jax.yaml \
	protein-3.5b_1xh100_s2048_jax_full.yaml protein-3.5b_1xh100_s2048_jax_op.yaml \
	protein-1.2b-h2048_1xh100_s8192_jax_sel.yaml protein-3.5b_1xh100_jax_search.yaml))
comma := ,
space := $(subst ,, )
bench-gpu-jax: venv
	$(RECORD) gpu-jax --out docs/results/bench-gpu-jax.json --figures runs/bench-gpu-jax/gpu_check.json -- \
		$(BIN)/python -m benchmarks.gpu_check --out runs/bench-gpu-jax --plans $(JAX_GPU_PLANS) --exaplan-only \
		--skip-device --rounds 1 --steps 10 --warmup 3

# On a GPU machine too: the step's kernels one by one (GEMMs, the fused attention backends,
# compiled elementwise work, the loss, exaplan's block by kernel kind), about a minute, then the
# cost model's terms against them (docs/validation/gpu.md, "Kernels against the
# cost model's terms").
bench-gpu-kernels: venv
	$(BIN)/python -m benchmarks.gpu_kernels --out runs/bench-gpu-kernels
	$(BIN)/exaplan validate --kernels runs/bench-gpu-kernels/gpu_kernels.json

# Issue-4 targets on this machine (median |step error| <= 10%, Spearman >= 0.9, first choice
# within 5% of the fastest, memory error <= 15%): 12 layouts through `exaplan run`, 2 rounds.
# About 15 minutes on 2 cores; run it on an otherwise idle machine.
BENCH_LOCAL_MACHINE ?= local
bench-local: venv
	$(BIN)/exaplan validate --local --machine $(BENCH_LOCAL_MACHINE) --steps 10 --repeats 2 --out runs/bench-local

plans: venv
	$(BIN)/python -m cli.examples

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
