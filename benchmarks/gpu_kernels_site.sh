#!/usr/bin/env bash
# Builds .kernelsite/ (git-ignored): the `kernels` extra's packages for the device, which reaches no package index:
# liger_kernel, cut_cross_entropy and torchao, copied from this venv (pip install 'lm[kernels]' first). Their Python
# is all that the kernels lm switches on need (Triton comes with the device's CUDA torch); torchao's compiled
# extensions (built for one torch and Python, for MX formats and CUTLASS kernels lm does not use) are left out, so
# the site stays ~15 MB of a device call's 64 MiB. benchmarks/gpu_kernels.sh puts it on PYTHONPATH beside .devsite/
# (benchmarks/gpu_devsite.sh: hydra, omegaconf). Carry both: run(carry=[".devsite", ".kernelsite"]).
#   . .venv/bin/activate && bash benchmarks/gpu_devsite.sh && bash benchmarks/gpu_kernels_site.sh
set -euo pipefail
site="$(python -c 'import liger_kernel, os; print(os.path.dirname(os.path.dirname(liger_kernel.__file__)))')"
rm -rf .kernelsite.tmp && mkdir -p .kernelsite.tmp
for pkg in liger_kernel cut_cross_entropy torchao; do cp -r "$site/$pkg" .kernelsite.tmp/; done
for info in "$site"/liger_kernel-*.dist-info "$site"/cut_cross_entropy-*.dist-info "$site"/torchao-*.dist-info; do
  cp -r "$info" .kernelsite.tmp/  # importlib.metadata versions (torchao and liger read their own)
done
find .kernelsite.tmp -name "*.so" -delete
find .kernelsite.tmp -name __pycache__ -prune -exec rm -rf {} +
rm -rf .kernelsite && mv .kernelsite.tmp .kernelsite  # never a half-built site under the real name
du -sh .kernelsite
