#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the real vLLM engine (CPU build) in a venv of its own under build/: tests/validate/test_vllm_engine.py runs the
# bundled pair in it and checks its counts against the runtime's emulation
bash scripts/setup-vllm.sh
export DFLASH_VLLM_PYTHON="$PWD/build/vllm-venv/bin/python"
# the real-engine tests must run here: one that finds no vLLM fails instead of skipping (tests/processes.py)
export DFLASH_REQUIRE_VLLM=1
. .venv/bin/activate
export NO_COLOR=1 HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
# A whole run (no arguments) also runs the Hub tests with the other major version of huggingface_hub,
# and the runtime and target tests with the newest transformers tested.
if [ $# -eq 0 ]; then
  bash scripts/test-hub-versions.sh
  bash scripts/test-transformers-versions.sh
fi
