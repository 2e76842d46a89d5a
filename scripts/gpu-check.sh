#!/usr/bin/env bash
# One call on a GPU machine (one H200: the parts' budgets add up to 500 s, under 9 minutes with the install): the
# CUDA tests, then the GPU figures, each part in its own time budget (benchmarks/gpu_check.py lists the parts,
# budgets and goals). Writes OUT/figures.json, OUT/figures.txt (failed tests' messages and tracebacks included)
# and OUT/gpu-check.log. Exit 0 when every part ran and passed, 1 otherwise.
#
#     bash scripts/gpu-check.sh OUT                 # on the GPU machine, from the repository root
#     bash scripts/gpu-check.sh --dry-run OUT       # the same parts on this CPU, tiny shapes (a few minutes)
#     bash scripts/gpu-check.sh OUT --parts steps --budget steps=200   # one part again, with more time
#     bash scripts/gpu-check.sh OUT --parts tests --all-tests --budget tests=400   # a second loan's tests
#
# The zlab part imports z-lab's dflash/model.py from build/zlab-dflash (a carried path; prepare-gpu.sh puts it
# there) or from --zlab DIR; it is never copied into the repository.
#
# It installs nothing from the network. Where build/gpu-wheels holds wheels (scripts/prepare-gpu.sh makes
# it here; about 28 MB, so it travels with the working tree as a carried path), they are installed with
# --no-index into build/gpu-site and put first on PYTHONPATH; the project runs from the working tree.
# torch is the machine's own (a CUDA build is some GB: it cannot travel); the check prints which torch and
# CUDA it found, and stops with exit 1 when there is no torch, no CUDA device, or a needed package is absent.
# PYTHON picks the interpreter (default python3). --dry-run uses the interpreter's packages as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dry=0
for a in "$@"; do [ "$a" = --dry-run ] && dry=1; done
if [ "$dry" = 0 ] && compgen -G "build/gpu-wheels/*.whl" >/dev/null; then
  rm -rf build/gpu-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target build/gpu-site \
    build/gpu-wheels/*.whl || { echo "gpu-check: the wheels in build/gpu-wheels do not install here" >&2; exit 1; }
  export PYTHONPATH="$PWD/build/gpu-site"
fi
export PYTHONPATH="$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR=1 HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the image's pytest plugins may not fit the carried pytest; the tests need none
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONUNBUFFERED=1
# one compile cache for every part and test process: a graph compiled once (the same draft step in the tests'
# shards, the steps part's dflash step measured again beside dflash2) is loaded, not compiled again
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$TORCHINDUCTOR_CACHE_DIR/triton}
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
exec "$PY" benchmarks/gpu_check.py "$@"
