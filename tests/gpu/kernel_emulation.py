"""CPU stand-ins for vLLM's Marlin kernels, so that tests/gpu/kernels.py's cases build and
run on CPU (tests/vllm/test_gpu_kernels_cpu.py): every call of the helper and of vLLM's
schemes as the GPU machine makes it, up to the kernel, which CUDA alone runs.

Each stand-in computes as tests/gpu/bounds.py's model of the kernel says Marlin does, in
torch on CPU: the packed weight read back with vLLM's own unpacking (not the helper's), each
dequantized weight rounded to bfloat16 once (INT8's q x scale; NVFP4's E2M1 value x E4M3 block
scale, exact in bf16), the products exact and summed in float32, NVFP4's global scale applied
to the float32 sum, the output rounded to bfloat16. So the bound must pass them, and every
plant, read from the corrupted packing as a kernel would read it, must fail.

`install(vllm_modules)` points vLLM 0.30.0's kernel choices (compressed-tensors' WNA16 and
NVFP4 schemes) at them; EXPECTED_KERNELS gives kernels.py the class names to expect instead of
Marlin's.
"""

from __future__ import annotations

import torch

NVFP4_BLOCK = 16


class EmulatedMarlinInt8:
    """vLLM's MPLinearKernel interface (as CompressedTensorsWNA16 builds it), on CPU."""

    def __init__(self, config, w_q_param_name: str = "weight_packed",
                 w_s_param_name: str = "weight_scale", w_zp_param_name: str | None = None):
        self.group = config.group_size
        self.weight: torch.Tensor | None = None

    @classmethod
    def can_implement(cls, config):
        return True, None

    def input_quant_key(self):
        return None  # weight-only: the input as it is

    def process_weights_after_loading(self, layer) -> None:
        from vllm.model_executor.layers.quantization.utils.quant_utils import (
            unpack_quantized_values_into_int32,
        )
        from vllm.scalar_type import scalar_types

        uint8b128 = scalar_types.uint8b128
        q = unpack_quantized_values_into_int32(layer.weight_packed.data, uint8b128, packed_dim=1)
        scale = layer.weight_scale.data.float().repeat_interleave(self.group, dim=1)
        self.weight = ((q - uint8b128.bias).float() * scale).to(torch.bfloat16)

    def apply_weights(self, layer, x: torch.Tensor, bias=None) -> torch.Tensor:
        return (x.float() @ self.weight.float().T).to(torch.bfloat16)


class EmulatedMarlinNvFp4:
    """vLLM's NvFp4LinearKernel interface (as CompressedTensorsW4A4Fp4 builds it), on CPU;
    the scheme has already renamed weight_packed to weight and inverted the global scale."""

    def __init__(self, *args, **kwargs):
        self.weight: torch.Tensor | None = None
        self.global_scale: torch.Tensor | None = None

    def input_quant_key(self):
        return None

    def process_weights_after_loading(self, layer) -> None:
        from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
            dequantize_to_dtype,
        )

        one = torch.tensor(1.0)
        blocks = dequantize_to_dtype(layer.weight.data, layer.weight_scale.data, one,
                                     torch.float32, NVFP4_BLOCK, swizzle=False)
        self.weight = blocks.to(torch.bfloat16)  # exact: 2 + 4 significant bits
        self.global_scale = layer.weight_global_scale.data.float()

    def apply_weights(self, layer, x: torch.Tensor, bias=None) -> torch.Tensor:
        return ((x.float() @ self.weight.float().T) * self.global_scale).to(torch.bfloat16)


EXPECTED_KERNELS = {"int8": EmulatedMarlinInt8.__name__, "nvfp4": EmulatedMarlinNvFp4.__name__}


def install() -> None:
    """vLLM 0.30.0's compressed-tensors schemes choose these stand-ins for Marlin."""
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_w4a4_nvfp4,
        compressed_tensors_wNa16,
    )

    compressed_tensors_wNa16.choose_mp_linear_kernel = lambda config: EmulatedMarlinInt8
    compressed_tensors_w4a4_nvfp4.init_nvfp4_linear_kernel = lambda **_: EmulatedMarlinNvFp4()
