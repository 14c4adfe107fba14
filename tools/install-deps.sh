#!/usr/bin/env bash
# Installs the Debian packages LayerStream builds with (skips apt when all are present).
# Used by the README's commands and by .ci/run.
set -euo pipefail
# The Python package (python/, LAYERSTREAM_PYTHON) and its tests: python3-dev, pybind11-dev,
# libdlpack-dev; python3-pytest, python3-numpy and python3-torch (CPU) run the Python, node
# and comfy-sliced tests.
PKGS="cmake g++ make ninja-build libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev python3 pkg-config
  python3-dev pybind11-dev libdlpack-dev python3-pytest python3-numpy python3-torch"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing
