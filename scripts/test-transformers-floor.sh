#!/usr/bin/env bash
# The runtime and target tests again with the lowest transformers pyproject.toml admits (the suite
# runs with the newest, requirements-test.txt's pin): the APIs the runtime calls changed between them
# (the cache keyword, linear-attention cache layers). The floor goes into a directory of its own under
# .venv, put first on PYTHONPATH for this run only.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR=$(sed -n 's/.*"transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml)
. .venv/bin/activate
dir=.venv/transformers-$FLOOR
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir"
  python -m pip install -q --no-deps --target "$dir" "transformers==$FLOOR"
  touch "$dir/.complete"
fi
export PYTHONPATH="$PWD/$dir${PYTHONPATH:+:$PYTHONPATH}"
python -c "import transformers, sys; sys.exit(transformers.__version__ != '$FLOOR')"
echo "Runtime and target tests with transformers $FLOOR (the floor; the suite ran with $(pip show transformers 2>/dev/null | sed -n 's/^Version: //p'))"
exec python -m pytest -q -p no:cacheprovider -W "error::FutureWarning" tests/test_targets.py tests/test_rope_types.py \
  tests/test_runtime_target.py tests/test_runtime_decode.py tests/test_runtime_model.py tests/test_trained_pair.py
