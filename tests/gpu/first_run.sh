#!/usr/bin/env bash
# The first GPU run on an offline node with its own PyTorch (tests/gpu/README.md), no make:
#   RESULTS_DIR=dir bash tests/gpu/first_run.sh    DRY_RUN=1: on a CPU    PYTHON=python3
# Needs wheelhouse-site/ beside the tree. Writes only under RESULTS_DIR; ends in <9 min.
set -u
cd "$(dirname "$0")/../.." || exit 2
mkdir -p "${RESULTS_DIR:?set RESULTS_DIR}" && R=$(cd "$RESULTS_DIR" && pwd)
PY=${PYTHON:-python3}
V=$PWD/.venv-site/bin/python
D=
[ "${DRY_RUN:-0}" = 1 ] && D=--dry-run
export GPU_LESSONS_RESULTS_DIR=$R/results PYTHONUNBUFFERED=1
T0=$(date +%s)
echo "first_run.sh ${D:-on the GPU}, $(date -u +%FT%TZ)" >"$R/steps.txt"
# step NAME SECONDS CMD...: at most SECONDS, and never past 530 s from the start
step() {
  local n=$1 b=$2 s
  shift 2
  s=$(date +%s)
  ((b > 530 - (s - T0))) && b=$((530 - (s - T0)))
  if ((b < 15)); then echo "$n: not run, out of time" >>"$R/steps.txt"; return; fi
  timeout -k 5 "$b" "$@" >"$R/$n.log" 2>&1
  echo "$n: exit $? in $(($(date +%s) - s)) s (limit $b s)" >>"$R/steps.txt"
}
step 0-site-env 150 "$PY" scripts/site_env.py setup --python "$PY" --venv .venv-site \
  --wheelhouse wheelhouse-site
step 1-facts 60 "$V" tests/gpu/first_run_probes.py facts --out "$R"
step 2-probes 90 "$V" tests/gpu/first_run_probes.py probes --out "$R"
step 3-gpu-a 240 "$V" scripts/gpu_check.py $D --force --part gpu-a --out "$R/gpu-check" \
  --results-dir "$R/results"
step 4-gpu-b 240 "$V" scripts/gpu_check.py $D --force --part gpu-b --out "$R/gpu-check" \
  --results-dir "$R/results"
echo "total $(($(date +%s) - T0)) s" >>"$R/steps.txt"
tar -C "$R" --exclude=first-run.tar.gz -czf "$R/first-run.tar.gz" . &&
  tar -tzf "$R/first-run.tar.gz" >"$R/tarball-files.txt"
cat "$R/steps.txt"
