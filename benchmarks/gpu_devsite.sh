#!/usr/bin/env bash
# Builds .devsite/ (git-ignored): the pure-Python packages the device's Python 3.12 lacks (hydra, omegaconf,
# antlr4, copied from this venv) and zstandard's C backend for CPython 3.12 (a wheel from the package index,
# its cffi backend dropped and debug symbols stripped: 3.3 MB instead of 25 MB, so that five Gutenberg shards
# still fit the 64 MiB a device call carries). A device command then sets PYTHONPATH=$PWD/.devsite:$PWD
# (benchmarks/gpu_transfer.sh does it when the modules are missing).
#   . .venv/bin/activate && bash benchmarks/gpu_devsite.sh
set -euo pipefail
site="$(python -c 'import omegaconf, os; print(os.path.dirname(os.path.dirname(omegaconf.__file__)))')"
rm -rf .devsite.tmp && mkdir -p .devsite.tmp .whl
for pkg in hydra omegaconf antlr4; do cp -r "$site/$pkg" .devsite.tmp/; done
ls .whl/zstandard-*-cp312-*.whl > /dev/null 2>&1 || \
  pip download zstandard --python-version 3.12 --only-binary=:all: --no-deps -d .whl
python -m zipfile -e "$(ls .whl/zstandard-*-cp312-*.whl | head -1)" .devsite.tmp/
rm -f .devsite.tmp/zstandard/_cffi.*.so
strip --strip-debug .devsite.tmp/zstandard/backend_c.*.so
find .devsite.tmp -name __pycache__ -prune -exec rm -rf {} +
rm -rf .devsite && mv .devsite.tmp .devsite  # never a half-built site under the real name
du -sh .devsite
