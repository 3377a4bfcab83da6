#!/bin/sh
# Here (a machine with the package registries): puts into .whl/ what bench/gpu_check/run.sh installs on
# the GPU machine, which reaches no registry. Its image has Python 3.12, PyTorch, numpy, scipy, psutil,
# httpx and prometheus-client; these wheels add gpuprobe itself and the versions of the rest that it needs.
set -eu
cd "$(dirname "$0")/../.."
rm -rf .whl
mkdir .whl
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl .
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  grpcio==1.85.3 protobuf==7.36.2 nvidia-ml-py==13.615.71 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
  aiomqtt==2.5.1 paho-mqtt==2.2.0 sounddevice==0.5.6 orjson==3.13.0
# the agent's native sampler, built here too: run.sh points the agent at it where the GPU machine has no C
# compiler to build it from the wheel's source
.venv/bin/python -m gpuprobe.nvml.native --out .whl/sampler >/dev/null
du -sh .whl
