#!/usr/bin/env bash
# The Hub tests again, with the other supported major version of huggingface_hub than the one in
# .venv (1.x talks HTTP through httpx, 2.x through httpx2; dflash-convert supports both). The other
# version goes into a directory of its own under .venv, put first on PYTHONPATH for this run only.
set -euo pipefail
cd "$(dirname "$0")/.."
HF_1X=1.33.0  # the newest 1.x
HF_2X=2.4.0   # the newest 2.x
. .venv/bin/activate
have=$(python -c "import huggingface_hub; print(huggingface_hub.__version__)")
case "$have" in
  1.*) other=$HF_2X; deps="" ;;           # 2.x also needs httpx2: install its dependencies beside it
  *)   other=$HF_1X; deps="--no-deps" ;;  # 1.x needs nothing the test environment lacks (httpx is there)
esac
dir=.venv/huggingface_hub-$other
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir"
  python -m pip install -q $deps --target "$dir" "huggingface_hub==$other"
  case "$other" in 1.*) python -c "import httpx" 2>/dev/null || python -m pip install -q --target "$dir" "httpx<1" ;; esac
  touch "$dir/.complete"
fi
export PYTHONPATH="$PWD/$dir${PYTHONPATH:+:$PYTHONPATH}"
python -c "import huggingface_hub as h, sys; sys.exit(h.__version__ != '$other')"
echo "Hub tests with huggingface_hub $other (the suite ran with $have)"
exec python -m pytest -q -p no:cacheprovider tests/hub
