#!/usr/bin/env bash
# Make kvsim runnable on a bare GPU machine that has torch but not kvsim's other dependencies
# (the device tool's image lacks simpy and plotly and has no package index), then run "$@":
#
#   here:   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#               --implementation cp --platform manylinux2014_x86_64 -d .whl simpy plotly
#           (with .whl/ in .git/info/exclude, carried to the machine)
#   there:  bash bench/device_env.sh bash bench/gpu_validate.sh "$OUT/gpu"
#
# Installs .whl/*.whl into /tmp/site, exposes this checkout as the package `kvsim` through a
# symlink, and puts `python` and `kvsim` wrappers on PATH (the image names only `python3`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3)
"$py" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
mkdir -p /tmp/pkgs /tmp/bin
ln -sfn "$root" /tmp/pkgs/kvsim
printf '#!/bin/sh\nexec %s "$@"\n' "$py" > /tmp/bin/python
printf '#!/bin/sh\nexec %s -m kvsim.cli "$@"\n' "$py" > /tmp/bin/kvsim
chmod +x /tmp/bin/python /tmp/bin/kvsim
export PATH=/tmp/bin:$PATH PYTHONPATH=/tmp/site:/tmp/pkgs${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
python -c "import kvsim.cli, torch; print('device_env: torch', torch.__version__)"
exec "$@"
