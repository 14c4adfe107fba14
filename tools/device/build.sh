#!/usr/bin/env bash
# Builds LayerStream with CUDA on the GPU machine, which lacks Debian's header
# packages: they travel in .deps/ (carried, git-ignored; made by copying
# /usr/include/CLI, /usr/include/nlohmann and /usr/src/googletest from a Debian box, and for the
# Python package that tools/device/comfyui_node.sh builds, /usr/include/pybind11 and
# /usr/include/dlpack too: without them CMake turns LAYERSTREAM_PYTHON off there).
# Usage (device): tools/device/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
B=${1:-build-gpu}; shift || true
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" "$@" >/dev/null
cmake --build "$B" -j16
