#!/usr/bin/env bash
# Fill build/gpu-wheels with what scripts/gpu-check.sh installs on a GPU machine that reaches no package
# registry: wheels of the Python packages the project and its tests import, at the versions the test venv
# here holds (the versions the tests pass with), for CPython 3.12 on x86-64 Linux.
#
# Left out, because the GPU machine's image provides them and a CUDA build of torch alone is some GB
# (over the 64 MiB that travels with the working tree): torch and what comes with it, numpy, pandas and
# pyarrow, and the compiled packages the image has (tokenizers, safetensors, pyyaml, ...). gpu-check.sh
# uses the torch it finds there and says which torch and CUDA that is. The project itself is not a wheel:
# it runs from the working tree, which travels anyway.
#
# Extras for the GPU alone, pinned: flash-linear-attention (Triton kernels, pure Python) so that a hybrid
# Qwen3.5 target's Gated DeltaNet layers run transformers' fast path there rather than its reference
# loops, which the hybrid rollback figure would otherwise measure. transformers uses it only on a GPU.
#
# flash-attn: the package index has only its source (no wheel for any torch/CUDA pair), and building it
# takes far longer than a GPU loan, so none is carried and the flash-attn tests skip there. A wheel put in
# build/gpu-wheels by hand (one built for that machine's torch and CUDA) is installed with the rest.
#
#     bash scripts/prepare-gpu.sh            # then: du -sh build/gpu-wheels  (about 25 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=build/gpu-wheels
# provided by the GPU image at versions transformers accepts (docs/gpu.md), or not needed there; regex is
# carried although the image has it: transformers 5.19 checks for a regex of 2025.10 or newer at import
PROVIDED="torch numpy sympy mpmath networkx pandas pyarrow tzdata python-dateutil six pip setuptools wheel
  dflash-convert aiohttp frozenlist multidict propcache yarl hf-xet psutil pyyaml safetensors tokenizers
  xxhash markupsafe jinja2"
EXTRAS="flash-linear-attention==0.6.0 fla-core==0.6.0"
mkdir -p "$DEST"
pins=$("$PY" - "$PROVIDED" <<'EOF'
import sys
from importlib import metadata

provided = {n.lower().replace("_", "-") for n in sys.argv[1].split()}
for dist in sorted(metadata.distributions(), key=lambda d: d.metadata["Name"].lower()):
    name = dist.metadata["Name"].lower().replace("_", "-")
    if name not in provided:
        print(f"{name}=={dist.version}")
EOF
)
pins="$pins $EXTRAS"
find "$DEST" -name "*.whl" ! -name "flash_attn-*" -delete  # one version of each: two stop the install
# shellcheck disable=SC2086  # one argument per pin
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" $pins
printf '%s\n' $pins > "$DEST/pins.txt"
echo "build/gpu-wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1)" >&2

# z-lab's reference loop for the GPU check's zlab part: benchmarks/zlab_bench.py imports dflash/model.py from
# build/zlab-dflash (a carried path on the GPU machine, which reaches no network); it is never copied into the
# repository. From the git directory ZLAB_DFLASH_GIT names (a clone or mirror of github.com/z-lab/dflash made
# elsewhere), else cloned here; ZLAB_DFLASH_REF picks the commit (default HEAD), recorded in COMMIT beside it.
ZLAB=build/zlab-dflash
rm -rf "$ZLAB" "$ZLAB.git"
mkdir -p "$ZLAB"
git_dir=${ZLAB_DFLASH_GIT:-}
if [ -z "$git_dir" ]; then
  git clone -q --bare --depth 1 https://github.com/z-lab/dflash "$ZLAB.git" && git_dir=$ZLAB.git || git_dir=
fi
if [ -n "$git_dir" ] && git --git-dir "$git_dir" archive "${ZLAB_DFLASH_REF:-HEAD}" dflash | tar -x -C "$ZLAB"; then
  git --git-dir "$git_dir" rev-parse "${ZLAB_DFLASH_REF:-HEAD}" > "$ZLAB/COMMIT"
  rm -rf "$ZLAB.git"
  echo "build/zlab-dflash: z-lab/dflash at $(cat "$ZLAB/COMMIT")" >&2
else
  rm -rf "$ZLAB" "$ZLAB.git"
  echo "build/zlab-dflash: no copy of z-lab/dflash (no network? set ZLAB_DFLASH_GIT): the zlab part will fail" >&2
fi
