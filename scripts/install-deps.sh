#!/usr/bin/env bash
# Installs every system package shardfeed needs to build, test and run its
# demo on Debian 12. Idempotent: packages already present are left alone.
set -euo pipefail
. "$(dirname "$0")/deps-lib.sh"

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libcurl4-openssl-dev libssl-dev libzstd-dev libturbojpeg0-dev libjpeg62-turbo-dev libstb-dev
  libjpeg-turbo-progs libcjson-dev libexpat1-dev libxxhash-dev libmicrohttpd-dev libcriterion-dev
  zlib1g-dev openssl # the mock's CRC32 checksums; the TLS conformance test's certificate
  python3 python3-dev python3-pip python3-boto3 awscli nginx-light
  oclgrind ocl-icd-opencl-dev opencl-c-headers
  clang-14 libclang-rt-14-dev # scripts/fuzz.sh: clang -fsanitize=fuzzer needs libclang_rt.fuzzer
)

apt_install_missing install-deps "${PACKAGES[@]}"

# The conformance test drives the mock server with boto3. The python3 on PATH
# may not be Debian's (pyenv, venv): make sure that one can import it too.
if ! python3 -c 'import boto3' 2>/dev/null; then
  echo "install-deps: installing boto3 for $(command -v python3)"
  pip_install boto3
fi

# The Python package's pytest suite (ctest's `python` test) and `pip install .`
# need these in the same python3. torch (PyPI's Linux wheel, large) only when
# it cannot be imported: the loader tests hand batches to torch.
announced_pip_install() {
  echo "install-deps: installing $* for $(command -v python3)"
  pip_install "$@"
}
py_missing=()
for m in pytest:pytest numpy:numpy scikit_build_core:scikit-build-core PIL:pillow; do
  if ! python3 -c "import ${m%%:*}" 2>/dev/null; then
    py_missing+=("${m#*:}")
  fi
done
if [ "${#py_missing[@]}" -gt 0 ]; then
  announced_pip_install "${py_missing[@]}"
fi
if ! python3 -c 'import torch' 2>/dev/null; then
  announced_pip_install torch
fi
# The demo's examples/train_torch.py (a torchvision ResNet-18).
if ! python3 -c 'import torchvision' 2>/dev/null; then
  announced_pip_install torchvision
fi
