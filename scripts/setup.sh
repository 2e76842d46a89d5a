#!/usr/bin/env bash
# Set up a virtual environment in .venv with everything dflash-convert and its tests need.
# Idempotent: a second run only checks. torch goes first and pinned: `torch==2.13.0` resolves to
# the CPU build on these machines, while a looser spec would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.dflash-setup-$(sha256sum pyproject.toml requirements-test.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then exit 0; fi
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
# -e .[test] and the transformers pin; setuptools' warnings about building an editable install (UserWarnings of
# the build backend, which pip runs in a subprocess of its own) are for packagers, not for whoever runs this
PYTHONWARNINGS=ignore::UserWarning python -m pip install -q -r requirements-test.txt
# speculators 0.9.0 pins torchvision/torchaudio builds that break the CPU torch: install it alone,
# what it imports is in the test extra.
python -m pip install -q --no-deps "speculators==0.9.0"
rm -f .venv/.dflash-setup-*
touch "$stamp"
