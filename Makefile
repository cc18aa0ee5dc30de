# gpu-lessons: everything a learner, instructor or CI needs, from a fresh clone.
#
#   make lab        set up .venv (once) and start JupyterLab on the lessons
#   make test       set up .venv (once) and run the whole test suite
#
# Options:  GPU=1   install the CUDA build of torch (Linux + NVIDIA driver >= 580); with
#                   GPU=1, `make test` is the GPU test mode (scripts/gpu_check.py)
#           SITE=1  a small environment over a Python that already has PyTorch (cluster)
#           PYTHON=python3.11   interpreter used to create the environment
#           PORT=8888           JupyterLab's port
#           WHEELHOUSE=dir      install offline from `make wheelhouse` (no internet needed;
#                               kernel-tf reads dir-tf, or WHEELHOUSE_TF=dir)
# More: make refresh LESSON=03, release, release-solutions, kernel, kernel-tf GPU=1 (TensorFlow
#       on the GPU, own environment), wheelhouse, outputs NB=03, minutes [NB=03],
#       gpu-check [PART= DRY_RUN=1], fuzz [EXAMPLES=12 OUT=fuzz.json]
# Setup re-runs only when requirements*.txt or pyproject.toml change.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# SITE=1: a small environment over a Python that already has PyTorch (a cluster module or
# container), in .venv-site; see README "A cluster node that already has PyTorch"
SITE ?= 0
ifeq ($(SITE),1)
PYTHON ?= python3
VENV ?= .venv-site
else
PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV ?= .venv
endif
# an environment set up with GPU=1 stays a GPU environment (make lab, test, kernel...)
GPU ?= $(if $(wildcard $(VENV)/.installed-gpu1),1,0)
PORT ?= 8888
WHEELHOUSE ?=
PIP_SOURCE := $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE))
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/$(if $(filter 1,$(SITE)),.installed-site,.installed-gpu$(GPU))
NB ?=
# requirements.txt without torch and TensorFlow, for GPU installs that take them from their own
# requirements file: $(call without_frameworks,DIR) writes DIR/requirements-nofw.txt
without_frameworks = grep -v -E '^(torch|tensorflow)' requirements.txt > $(1)/requirements-nofw.txt
# pytest-xdist workers for the notebook tests (one kernel per notebook file)
WORKERS ?= 2

.PHONY: help setup lab refresh test test-unit test-notebooks test-browser lessons outputs \
        check-lessons minutes lint bench stress browser clean release release-solutions kernel \
        wheelhouse gpu-check kernel-tf fuzz

help:  # the comment block at the top of this file, up to the first blank line
	@awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' Makefile

# ---------------------------------------------------------------- environment
ifeq ($(SITE),1)
# site_env.py decides each time (in a fraction of a second) whether anything changed: the
# site's Python, its torch/TensorFlow, requirements-site.txt or the wheelhouse
.PHONY: site-env-check
$(STAMP): site-env-check
	$(PYTHON) scripts/site_env.py setup --python $(PYTHON) --venv $(VENV) \
	  $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE))
else
$(STAMP): requirements.txt requirements-gpu.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; \
	  sys.exit(0) if v >= (3, 11) else sys.exit(f"Python 3.11 or newer is needed, found {v[0]}.{v[1]}")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(WHEELHOUSE),,$(PY) -m pip install --quiet --upgrade pip)
ifeq ($(GPU),1)
	@# a CPU torch (2.13.0+cpu satisfies ==2.13.0) and tensorflow-cpu go first; the
	@# constraints exclude the +cpu wheel that pip would otherwise prefer
	$(PY) scripts/gpu_setup.py prepare requirements-gpu.txt \
	  --constraints $(VENV)/constraints-gpu.txt
	$(call without_frameworks,$(VENV))
	$(PY) -m pip install --quiet $(PIP_SOURCE) -c $(VENV)/constraints-gpu.txt \
	  -r requirements-gpu.txt -r $(VENV)/requirements-nofw.txt
else
	$(PY) -m pip install --quiet $(PIP_SOURCE) -r requirements.txt
endif
	$(PY) -m pip install --quiet --no-deps $(PIP_SOURCE) -e .
ifeq ($(GPU),1)
	@# fails unless torch is a CUDA build, and when NVML sees a GPU torch cannot use
	$(PY) scripts/gpu_setup.py verify
endif
	@rm -f $(VENV)/.installed-gpu*
	@touch $@
	@echo "environment ready in $(VENV) (GPU=$(GPU))"
endif

setup: $(STAMP)

# ---------------------------------------------------------------- learners
# Learners work in my-lessons/ (git-ignored): lessons are copied there once and never
# overwritten, so `git pull` never conflicts with their edits. Token authentication is
# JupyterLab's default; the URL with the token is printed below. Opens on lesson 00, the index.
lab: setup
	@$(PY) -m helpers.authoring.build personal
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) --ServerApp.root_dir=my-lessons \
	  --LabApp.default_url=/lab/tree/00_setup.ipynb \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# a fresh copy of one lesson in my-lessons/ (yours is moved to my-lessons/backup/)
refresh: setup
	@test -n "$(LESSON)" || { echo "usage: make refresh LESSON=03"; exit 2; }
	$(PY) -m helpers.authoring.build personal --refresh $(LESSON)

# ---------------------------------------------------------------- instructors and clusters
release: setup
	$(PY) -m helpers.authoring.build release

release-solutions: setup
	$(PY) -m helpers.authoring.build release --solutions

# register this environment as a Jupyter kernel (site JupyterHub / Open OnDemand)
KERNEL_NAME ?= gpu-lessons
kernel: setup
	$(PY) -m ipykernel install --user --name $(KERNEL_NAME) \
	  --display-name "Python (gpu-lessons)"

# TensorFlow on the GPU (GPU=1 machines): its own environment and kernel, because
# tensorflow[and-cuda] brings CUDA 12 and torch 2.13 CUDA 13; installed together they overwrite
# each other's cuDNN and NCCL (README "GPU machines"). Its torch is the CPU build, on purpose.
VENV_TF ?= .venv-tf
PY_TF := $(VENV_TF)/bin/python
# its wheels offline: `make wheelhouse GPU=1` puts them in wheelhouse-tf/, apart from wheelhouse/
# (another torch and CUDA stack); WHEELHOUSE=dir reads dir-tf, WHEELHOUSE_TF=dir names the folder
WHEELHOUSE_TF ?= $(if $(WHEELHOUSE),$(patsubst %/,%,$(WHEELHOUSE))-tf)
PIP_SOURCE_TF = $(if $(WHEELHOUSE_TF),--no-index --find-links $(WHEELHOUSE_TF))
$(VENV_TF)/.installed: requirements.txt requirements-gpu-tf.txt pyproject.toml
	@test -x $(PY_TF) || $(PYTHON) -m venv $(VENV_TF)
	$(if $(WHEELHOUSE_TF),,$(PY_TF) -m pip install --quiet --upgrade pip)
	$(call without_frameworks,$(VENV_TF))
	$(PY_TF) -m pip install --quiet $(PIP_SOURCE_TF) -r requirements-gpu-tf.txt \
	  -r $(VENV_TF)/requirements-nofw.txt
	$(PY_TF) -m pip install --quiet --no-deps $(PIP_SOURCE_TF) -e .
	$(PY_TF) -c 'import sys, tensorflow as tf; \
	  sys.exit(0 if tf.config.list_physical_devices("GPU") else "TensorFlow sees no GPU")'
	@touch $@

kernel-tf: $(VENV_TF)/.installed
	$(PY_TF) -m ipykernel install --user --name $(KERNEL_NAME)-tf \
	  --display-name "Python (gpu-lessons, TensorFlow GPU)"

# wheels for offline installs on compute nodes: `make setup WHEELHOUSE=wheelhouse`.
# GPU=1: also wheelhouse-tf/, the TensorFlow GPU environment's (`make kernel-tf WHEELHOUSE=...`)
# SITE=1: only what gpu-check needs beyond a site's Python, for PYVER (default: PYTHON's),
# without SITE_PROVIDES (set it empty to download numpy and matplotlib too, about 39 MiB more)
PYVER ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SITE_PROVIDES ?= numpy matplotlib
wheelhouse: $(if $(filter 1,$(SITE)),,setup)
ifeq ($(SITE),1)
	$(PYTHON) scripts/site_env.py wheelhouse --dest wheelhouse-site --pyver $(PYVER) \
	  --without $(SITE_PROVIDES)
	@echo "wheelhouse-site/ ready: copy the kit to the node, then"
	@echo "  make gpu-check SITE=1 WHEELHOUSE=wheelhouse-site"
else ifeq ($(GPU),1)
	$(call without_frameworks,$(VENV))
	$(PY) -m pip download --quiet -d wheelhouse -r requirements-gpu.txt \
	  -r $(VENV)/requirements-nofw.txt setuptools wheel
	@# in a folder of its own, so that each folder holds one torch (the +cpu wheel from the index
	@# that requirements-gpu-tf.txt names satisfies torch==2.13.0 too) and one CUDA stack
	$(PY) -m pip download --quiet -d wheelhouse-tf -r requirements-gpu-tf.txt \
	  -r $(VENV)/requirements-nofw.txt setuptools wheel
	@echo "wheelhouse-tf/ ready (TensorFlow GPU environment): make kernel-tf WHEELHOUSE=wheelhouse"
else
	$(PY) -m pip download --quiet -d wheelhouse -r requirements.txt setuptools wheel
endif
	$(if $(filter 1,$(SITE)),,@echo "wheelhouse/ ready: copy the kit to the cluster, then \
	  make lab WHEELHOUSE=wheelhouse")

# ---------------------------------------------------------------- tests
# A real browser for the widget tests (tests/browser/conftest.py looks in the same order):
# CHROMIUM_PATH if set, else chromium / chromium-browser / google-chrome on PATH, else Debian's
# package when we are root. Otherwise the browser tests skip loudly (and fail with CI=true).
browser:
	@if [ -n "$${CHROMIUM_PATH:-}" ]; then echo "browser: $$CHROMIUM_PATH"; \
	elif command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	     || command -v google-chrome >/dev/null 2>&1 \
	     || command -v google-chrome-stable >/dev/null 2>&1; then echo "browser: found on PATH"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "browser: installing Debian's chromium"; \
	  apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "browser: none found; the browser tests will skip. Install chromium, or run"; \
	  echo "  $(PY) -m playwright install chromium, or set CHROMIUM_PATH"; fi

# GPU=1 (a CUDA environment): the GPU test mode, i.e. `make gpu-check` (every part in turn)
test: setup $(if $(filter 1,$(GPU)),,browser)
	@test -d tests || { echo "The tests are not part of this bundle: clone the kit's repository."; exit 2; }
ifeq ($(GPU),1)
	$(PY) scripts/gpu_check.py $(GPU_CHECK_FLAGS)
else
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-unit test-notebooks test-browser; \
	echo "make test: all passed in $$(( $$(date +%s) - start )) s"
endif

test-unit: setup
	$(BIN)/ruff check .
	$(PY) -m helpers.authoring.build lessons --check
	$(PY) -m pytest tests -m "not browser" -q -n $(WORKERS) --ignore=tests/rehearsal
	@# the CPU rehearsal of the CUDA-only lines (tests/rehearsal, under coverage): its tests must
	@# pass and execute >= 80 % of those lines; it prints the share per file and what did not run
	$(PY) scripts/cuda_coverage.py --min 0.8

test-notebooks: setup
	$(PY) -m pytest --nbval lessons solutions --nbval-sanitize-with tests/sanitize.cfg \
	  --nbval-cell-timeout=600 -n $(WORKERS) --dist loadfile -q $(if $(NB),-k "$(NB)")

test-browser: setup
	$(PY) -m pytest tests/browser -m browser -q

# The GPU test mode (tests/gpu/README.md): unit tests, tests/gpu, every solutions notebook, in
# resumable parts of <= 4 min on one H200; results and logs in gpu-check-results/<date>/.
#   PART=gpu-a (or unit, gpu-b, notebooks-a ...; scripts/gpu_check.py --list)  one part only
#   FORCE=1     re-run parts that already passed      DRY_RUN=1   on a CPU, CPU stand-ins
PART ?=
DRY_RUN ?=
GPU_CHECK_FLAGS = $(if $(PART),--part $(PART)) $(if $(filter 1,$(FORCE)),--force) \
  $(if $(filter 1,$(DRY_RUN)),--dry-run)
gpu-check: setup
	$(PY) scripts/gpu_check.py $(GPU_CHECK_FLAGS)

# ---------------------------------------------------------------- authors
lessons: setup
	$(PY) -m helpers.authoring.build lessons $(NB)

outputs: setup
	$(PY) -m helpers.authoring.build outputs $(NB)

check-lessons: setup
	$(PY) -m helpers.authoring.build lessons --check

# each lesson's stated minutes against the estimate of its core and its Going further part
# (words, code lines, the run times `make outputs` recorded, exercise minutes);
# tests/test_lesson_time.py holds each lesson to it
minutes: setup
	$(PY) -m helpers.authoring.build minutes $(NB)

lint: setup
	$(BIN)/ruff check .

# launch the DDP training script, then lesson 03's solved DDP exercise, RUNS times each in a
# row and count failures (not part of `make test`)
RUNS ?= 30
stress: setup
	$(PY) scripts/stress_ddp.py --runs $(RUNS)
	$(PY) scripts/stress_ddp.py --runs $(RUNS) --script exercise

# fuzz the public API, the planner and the command-line programs in a sandbox folder with
# resource limits (tests/fuzz/fuzz_api.py; not part of `make test`)
EXAMPLES ?= 12
OUT ?= fuzz.json
fuzz: setup
	$(PY) tests/fuzz/fuzz_api.py --repo . --examples $(EXAMPLES) --out $(OUT)

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf build dist test-artifacts .pytest_cache  # never my-lessons/: learners' work
