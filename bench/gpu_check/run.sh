#!/bin/sh
# On the GPU machine, from the repository root, with .whl/ carried (bench/gpu_check/prepare.sh made it):
# installs the wheels into /tmp/site and runs the check; the results go to $OUT (the device tool brings
# back what is there) or /tmp/gpu-check. SCALE (default 1, about 6 minutes) scales every phase.
set -eu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# the agent's native sampler: built from the wheel's source on first use, or prepare.sh's build without a compiler
command -v "${CC:-gcc}" >/dev/null 2>&1 || export GPUPROBE_SAMPLER_LIB_DIR="$PWD/.whl/sampler"
nvidia-smi -L || true
exec python3 bench/gpu_check/check.py --out "${OUT:-/tmp/gpu-check}" --scale "${SCALE:-1}"
