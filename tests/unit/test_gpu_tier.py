"""The GPU tier's parts that need no GPU (tests/gpu; the tier itself runs by hand on an H200):
the margin target decides every greedy token far above bfloat16's rounding, and each server
runs the launcher's own serve argv with only the overrides the tier names."""

from __future__ import annotations

import json

from tests.gpu import models
from tests.gpu.engine import ADDED, OVERRIDES, served_argv, served_env
from tests.gpu.payload import launcher_rank0


def test_margin_target_decides_far_above_bf16_rounding():
    target = models.margin_target_dir()
    found = json.loads((target / "next_token.json").read_text())
    table = found["next_token"]
    special = set(models.tiny_models.special_ids(models.tiny_models.tokenizer_dir()))
    ordinary = [t for t in range(len(table)) if t not in special]
    # nothing leads to a special token; the ordinary tokens are permuted
    assert sorted(table[t] for t in ordinary) == ordinary
    assert not special & set(table)
    assert found["min_margin_nats"] >= models.MARGIN_OVER_ROUNDING * found["bf16_rounding_nats"]
    # the float64 check itself refuses a target built without the margin
    tensors, table = models.margin_tensors(models.tiny_models.tokenizer_dir())
    tensors["lm_head.weight"] *= 0.0
    try:
        models.margins(tensors, table)
    except ValueError as error:
        assert "not its table" in str(error)
    else:
        raise AssertionError("a target whose greedy choice is not its table was accepted")


def test_servers_run_the_launchers_argv_with_only_the_named_overrides(tmp_path):
    launcher = launcher_rank0("/models/tiny")
    spec = {"method": "dflash", "model": "/d", "num_speculative_tokens": 3}
    argv = served_argv(launcher, tmp_path / "m", 1234, spec, kv_auto=False)[3:]
    original = launcher["argv"]
    assert argv[:2] == ["serve", str(tmp_path / "m")]
    changed = {flag for flag, value in zip(original[2::2], original[3::2])
               if argv[argv.index(flag) + 1] != value}
    assert changed == set(OVERRIDES) | {"--speculative-config"}
    assert argv[argv.index("--compilation-config") + 1] == \
        '{"cudagraph_capture_sizes":[1,2,4,8]}'  # the launcher's sizes at k = 3, two sequences
    for flag, (value, _) in ADDED.items():
        assert argv[argv.index(flag) + 1] == value
    undrafted = served_argv(launcher, tmp_path / "m", 1234, None, kv_auto=True)
    assert "--speculative-config" not in undrafted
    assert undrafted[undrafted.index("--kv-cache-dtype") + 1] == "auto"
    # the launcher's v13 environment passes unchanged unless a server replaces it
    env = served_env(launcher, tmp_path, None, remap=False)
    levers = {k: v for k, v in launcher["env"].items() if k.startswith("GLM53_")}
    assert levers and all(env[k] == v for k, v in levers.items())
    assert not any(k.startswith("GLM53_") for k in served_env(launcher, tmp_path, {}, False))
