#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export NO_COLOR=1 HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q -p no:cacheprovider "$@"
# A whole run (no arguments) also runs the Hub tests with the other major version of huggingface_hub,
# and the runtime and target tests with the lowest transformers pyproject.toml admits.
if [ $# -eq 0 ]; then
  bash scripts/test-hub-versions.sh
  bash scripts/test-transformers-floor.sh
fi
