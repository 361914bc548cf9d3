#!/usr/bin/env bash
# deps.sh — installs what building and testing fastgrad needs on a fresh Debian/Ubuntu
# machine (compiler, CMake, OpenBLAS, Python with numpy and pytest), and nothing when
# it is already there. nvcc is optional: without it the library builds CPU-only.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v make >/dev/null 2>&1 || need+=(make)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# Python's headers, for the compiled per-call module fastgrad._fastcall (CMake skips it without them)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  >/dev/null 2>&1 || need+=(python3-dev)
if ! { [ -e /usr/include/cblas.h ] || ls /usr/include/*/cblas.h /usr/include/*/*/cblas.h >/dev/null 2>&1; } ||
   ! ldconfig -p 2>/dev/null | grep -q libopenblas; then
  need+=(libopenblas-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Python test dependencies (numpy, pytest) for the Python layer: pip for the python3 on
# PATH (pyenv or a venv), else Debian's packages for the system python3.
if ! python3 -c "import numpy, pytest" >/dev/null 2>&1; then
  echo "deps: installing numpy and pytest"
  python3 -m pip install -q numpy pytest >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages numpy pytest >/dev/null 2>&1 || {
      sudo=""
      [ "$(id -u)" -eq 0 ] || sudo="sudo"
      export DEBIAN_FRONTEND=noninteractive
      $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends python3-numpy python3-pytest >/dev/null
    }
  python3 -c "import numpy, pytest" || { echo "deps: numpy and pytest could not be installed" >&2; exit 1; }
fi
# torch (CPU build) for the torch test modules, best effort: they skip without it, so a machine
# that cannot reach the package index still builds and passes (FG_NO_TORCH=1: do not try).
if [ -z "${FG_NO_TORCH:-}" ] && ! python3 -c "import torch" >/dev/null 2>&1; then
  echo "deps: installing torch (CPU) for the torch tests"
  idx="--index-url https://download.pytorch.org/whl/cpu --timeout 30 --retries 1"
  python3 -m pip install -q $idx torch >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages $idx torch >/dev/null 2>&1 ||
    echo "deps: torch could not be installed; the torch tests will skip"
fi
