"""FlashInfer 0.7.x's FA MLA planner with FP8 KV, run on CPU as it would judge each device.

Run with PYTHONPATH=<root holding flashinfer/>; prints one JSON line. The device queries the
planner makes (compute capability, shared memory, SM count) are answered per device below;
everything else is FlashInfer's own code, stock or patched by v8 (F2, F3).
"""

import json

import torch

from flashinfer.mla._batch_mla._backends import _fa_common as planner

# (major, minor): (shared memory per SM, opt-in per block, SMs), as CUDA reports them
DEVICES = {
    "9": ((9, 0), 233472, 232448, 132),  # H100 / H200
    "10": ((10, 0), 233472, 232448, 148),  # B200
    "12": ((12, 1), 102400, 101376, 48),  # GB10 (DGX Spark)
}


def as_device(name: str) -> None:
    capability, per_sm, per_block, sms = DEVICES[name]
    planner.get_compute_capability = lambda device: capability
    planner._get_fa_shared_memory_limits = lambda device: (per_sm, per_block)
    planner.get_device_sm_count = lambda device: sms


def plan_verdict(head_dim_kpe: int) -> str:
    """_validate_generated_fa_plan for one decode row of FP8 KV, as the fa2 backend calls it."""
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    try:
        planner._validate_generated_fa_plan(
            backend="fa2",
            device=torch.device("cpu"),
            qo_indptr=indptr,
            kv_indptr=indptr,
            kv_indices=torch.tensor([0], dtype=torch.int32),
            kv_len_arr=torch.tensor([1], dtype=torch.int32),
            head_dim_ckv=512,
            head_dim_kpe=head_dim_kpe,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.float8_e4m3fn,
            output_dtype=torch.bfloat16,
            scale_mode="kv-per-tensor",
        )
        return "planned"
    except planner._BackendPlanUnsupportedError as error:
        return f"unsupported: {error}"


def causal_bound(key: int) -> str:
    """The causal tile bound on one request whose cluster-end query sees key ``key`` last:
    24 heads, 8 queries (a 128-row query tile ends inside query 5)."""
    q_len = 8
    try:
        planner._validate_fa_causal_tile_bound(
            [q_len], [key + q_len - 5], 24, "fa2", torch.float8_e4m3fn, torch.device("cpu")
        )
        return "accepted"
    except planner._BackendPlanUnsupportedError as error:
        return f"refused: {error}"


def main() -> None:
    report = {"flashinfer_file": planner.__file__, "plan": {}, "shared_bytes": {}, "causal": {}}
    for name in DEVICES:
        as_device(name)
        report["plan"][name] = {str(kpe): plan_verdict(kpe) for kpe in (0, 64)}
        per_sm = DEVICES[name][1]
        report["shared_bytes"][name] = {
            str(kpe): planner._generated_fa_shared_bytes("fa2", 512, kpe, True, per_sm)
            for kpe in (0, 64)
        }
        report["causal"][name] = {str(key): causal_bound(key) for key in (48, 64)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
