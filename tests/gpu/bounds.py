"""How far a bfloat16 kernel's product may be from the exact one: the bound the GPU tier's
kernel checks judge by (tests/gpu/kernels.py), and that a check of any other bf16 GEMM of a
dequantized weight can call (for example the ModelOpt fused-MoE check, per expert GEMM).
Imports torch only (no vLLM, no CUDA): it runs on whatever device its tensors are on, and the
unit tier proves it on CPU (tests/unit/test_gpu_bounds.py). docs/gpu-tier.md says why this
bound and not another.

The model of the kernel (what Marlin's INT8 and FP4 kernels, cuBLAS's BF16 GEMM and the CPU
emulation in tests/gpu/kernel_emulation.py all do): the input x is bfloat16 and used as it
is; each dequantized weight is rounded to bfloat16 at most once (relative error at most
u = 2^-8, bf16's unit roundoff: 8 significant bits, round to nearest); the products are
exact in float32 and accumulated in float32 (in any order, any split); scales applied to the
accumulated sum are float32; the output is rounded to bfloat16 once.

The error of one output y = sum_i x_i w_i is then three terms:

- weight rounding: sum_i x_i w_i d_i with |d_i| <= u. The d_i are the weight's (fixed by w);
  the signs of the x_i are independent and symmetric (the checks draw x from randn, or use
  one-hot rows), so by Hoeffding's inequality |sum| <= z u ||x o w||_2 except with
  probability at most 2 exp(-z^2 / 2), and never more than u sum_i |x_i w_i|. The bound
  takes the smaller: a sqrt(K) bound where the sum is long, exact where it is short.
- float32 accumulation of n nonzero terms: at most min(z sqrt(n), n) u32 sum_i |x_i w_i|,
  u32 = 2^-24 (n u32 is the worst case of any summation order; z sqrt(n) u32 the
  probabilistic bound of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, failing with
  probability at most n 2 exp(-z^2 / 2)).
- output rounding: at most u times the accumulated value, |y| plus the two terms above.

With Z = 8 the bound fails an honest kernel with probability at most FALSE_FAIL_PER_OUTPUT
(about 2.5e-14, plus n times that for the accumulation) per output element: over the tier's
few times 10^8 judged elements, under 1e-4 a run, so a failure is a fault, not luck.
"""

from __future__ import annotations

import math

import torch

BF16_UNIT_ROUNDOFF = 2.0 ** -8  # bf16: 8 significant bits, round to nearest
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
Z = 8.0  # standard deviations, in Hoeffding's sense, that the bound allows
FALSE_FAIL_PER_OUTPUT = 2.0 * math.exp(-Z * Z / 2.0)


def bf16_product_bound(x: torch.Tensor, w: torch.Tensor,
                       exact: torch.Tensor | None = None) -> torch.Tensor:
    """The per-element bound on |y - x w^T| for a kernel of the model above.

    x: (M, K), the input exactly as the kernel got it (bf16 values, any dtype holding them).
    w: (N, K), the dequantized weight the kernel should compute with, exact (float32 or
       float64: the packed values times their scales, before any bf16 rounding).
    exact: (M, N), x w^T in float64, when the caller has it already.
    Returns (M, N) float64: the bound for each output element. The statistic judged is
    `error_over_bound(y, x, w).max()`: a kernel passes when it is at most 1.
    """
    x64, w64 = x.double(), w.double()
    if exact is None:
        exact = x64 @ w64.T
    magnitude = x64.abs() @ w64.abs().T  # sum_i |x_i w_i|
    spread = (x64.square() @ w64.square().T).sqrt()  # ||x o w||_2
    terms = (x64 != 0).sum(dim=1, keepdim=True).double()  # n: the nonzero products
    weight_rounding = BF16_UNIT_ROUNDOFF * torch.minimum(Z * spread, magnitude)
    accumulation = torch.minimum(Z * terms.sqrt(), terms) * FLOAT32_UNIT_ROUNDOFF * magnitude
    inner = weight_rounding + accumulation
    return inner + BF16_UNIT_ROUNDOFF * (exact.abs() + inner)


def error_over_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(M, N) float64: |y - x w^T| / bf16_product_bound, per element of the kernel's output Y
    (x, w as bf16_product_bound takes them). inf where y is not finite, or wrong where the
    bound is 0 (an exact zero output); 0 where both are 0."""
    exact = x.double() @ w.double().T
    error = (y.double() - exact).abs()
    bound = bf16_product_bound(x, w, exact)
    ratio = torch.where(bound > 0, error / bound.clamp_min(1e-300),
                        torch.where(error > 0, math.inf, 0.0))
    return torch.where(torch.isfinite(y.double()), ratio, math.inf)
