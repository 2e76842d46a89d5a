#!/usr/bin/env bash
# Set up (if needed) and run the main job on the bundled example: convert the bundled trained
# speculators draft to the Hugging Face format, inspect it, and validate it end to end against
# the bundled target. Output goes to ./out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export NO_COLOR=${NO_COLOR:-} HF_HUB_DISABLE_TELEMETRY=1
mkdir -p out
set -x
dflash-convert convert examples/pair/draft -o out/draft-hf --verifier examples/pair/target --overwrite --validate
dflash-convert inspect out/draft-hf
dflash-convert validate out/draft-hf --target examples/pair/target --prompts examples/pair/prompts.txt \
  --sampling greedy --min-acceptance-length 10 --junit out/validation.xml --report-md out/validation.md \
  --json > out/validation.json
dflash-convert diff examples/pair/draft out/draft-hf
