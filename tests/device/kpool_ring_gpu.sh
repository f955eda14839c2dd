#!/usr/bin/env bash
# The kpool ring simulation (tests/vllm/kpool_ring_sim.py) compiled by real Triton on a GPU.
# Needs the kernel files in DIR (default .sim-kernels): patched_kpool_compress.py and
# glm53_v13_switches.py from a tree with v13 applied (scripts/patch-layer v13 on 0.30.0),
# stock_kpool_compress.py (0.30.0) and upstream_kpool_compress.py (0.33.0). CI does not run it.
set -euo pipefail
dir="${1:-.sim-kernels}"
out="${OUT:-.}"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
python3 tests/vllm/kpool_ring_sim.py --device cuda \
  --kernels "${dir}/patched_kpool_compress.py" --switches "${dir}/glm53_v13_switches.py" \
  --stock "${dir}/stock_kpool_compress.py" --upstream "${dir}/upstream_kpool_compress.py" \
  | tee "${out}/kpool_ring_gpu.json"
