"""The rest of the first hour's refusals (issue 36), each in one line before anything runs:
a chain tag the chain does not build, TP more ranks a node than its GPUs, TP that does not
split the model's heads (where its config is on the head), and a recipe.lock of valid TOML
but the wrong shape."""

import json
import stat

import pytest

from recipekit.baselock import BaseLock, LockError
from tests.checkout import copy_checkout
from tests.unit.test_launcher_lifecycle import make_cluster, serve, started
from tests.unit.test_launcher_support import NODES, run, sealed_bin

CHAIN = ("glm53-sm121-v8 | glm53-sm121-v9 | glm53-sm121-v10 | glm53-sm121-v11 | "
         "glm53-sm121-v13")


def refused(result, line):
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == f"refused: {line}\n"


@pytest.mark.parametrize("image", ["glm53-sm121-v12", "registry.example/glm53-sm121-v7:local"])
def test_a_chain_tag_the_chain_does_not_build_is_refused_as_such(tmp_path, image):
    layer = image.split("-v")[-1].split(":")[0]
    refused(run(tmp_path, IMAGE=image), f"IMAGE={image}: the image chain has no v{layer} (docker/ "
            f"has no Dockerfile.sm121-v{layer}); accepted: {CHAIN}, or an image named otherwise")


def test_an_image_named_otherwise_is_not_a_chain_tag(tmp_path):
    assert run(tmp_path, IMAGE="lab/my-serving-image:1").returncode == 0


@pytest.mark.parametrize("text, key", [
    ('images = "x"\n', "images = 'x' is not a table"),
    ("images = [1, 2]\n", "images = [1, 2] is not a table"),
    ('[images]\n"vllm/vllm-openai:x" = 3\n', '[images."vllm/vllm-openai:x"] is not a table'),
])
def test_a_lock_of_the_wrong_shape_is_refused_in_one_line_naming_file_and_key(tmp_path, text, key):
    path = tmp_path / "recipe.lock"
    path.write_text(text)
    with pytest.raises(LockError) as raised:
        BaseLock.read(path)
    assert str(raised.value).startswith(f"{path}: {key}")
    assert "\n" not in str(raised.value)


def test_run_sh_refuses_a_wrong_shaped_lock_in_one_line(tmp_path):
    root = copy_checkout(tmp_path / "checkout")
    (root / "recipe.lock").write_text('images = "x"\n')
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, root=root, SPEC="off")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "refused: recipe.lock: images = 'x' is not a table; accepted: [images.\"REF\"] tables as "
        "scripts/build.sh writes them; fix it, or delete the file to trust the base images there "
        "again on the next build"]
    assert started(state) == []


def plant_gpus(tmp_path, count):
    """nvidia-smi --list-gpus on every fake node lists COUNT GPUs."""
    lines = "".join(f"GPU {n}: NVIDIA GB10 (UUID: GPU-{n})\\n" for n in range(count))
    tool = sealed_bin(tmp_path) / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\nprintf "{lines}"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_tp_asking_more_ranks_a_node_than_its_gpus_is_refused_before_any_rank(tmp_path):
    state = make_cluster(tmp_path)
    plant_gpus(tmp_path, 1)
    result = serve(tmp_path, state, TP=4)
    refused(result, f"TP=4: {NODES[0]} (head) has 1 GPU(s), but TP=4 on 2 nodes runs 2 ranks a "
            "node, one a GPU; accepted: the node count 2 (a DGX Spark has one GPU), or empty")
    assert started(state) == []


def test_tp_within_the_gpus_a_node_has_passes_the_count(tmp_path):
    state = make_cluster(tmp_path)
    plant_gpus(tmp_path, 2)
    result = serve(tmp_path, state, TP=4, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert len(started(state)) == 2


def local_model(tmp_path, **config):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_tp_that_does_not_split_a_local_models_heads_is_refused(tmp_path):
    model = local_model(tmp_path, num_attention_heads=64, num_key_value_heads=64)
    refused(run(tmp_path, nodes=3, MODEL=model, MODEL_REVISION=None),
            f"TP=3: {model}/config.json has num_attention_heads 64, which TP=3 does not split "
            "evenly over its ranks; accepted: none with 3 nodes; use a node count that divides 64")
    refused(run(tmp_path, nodes=2, TP=6, MODEL=model, MODEL_REVISION=None),
            f"TP=6: {model}/config.json has num_attention_heads 64, which TP=6 does not split "
            "evenly over its ranks; accepted: a multiple of the node count 2 that splits them: "
            "2 | 4 | 8 | 16 | 32 | 64")
    # a config.json alone is no checkpoint: the scan DRY_RUN runs would refuse it
    assert run(tmp_path, nodes=2, MODEL=model, MODEL_REVISION=None,
               CHECKPOINT_SCAN="off").returncode == 0


def test_kv_heads_fewer_than_tp_must_divide_it(tmp_path):
    model = local_model(tmp_path, text_config={"num_attention_heads": 12, "num_key_value_heads": 4})
    assert run(tmp_path, nodes=2, MODEL=model, MODEL_REVISION=None,
               CHECKPOINT_SCAN="off").returncode == 0
    refused(run(tmp_path, nodes=3, MODEL=model, MODEL_REVISION=None),
            f"TP=3: {model}/config.json has num_key_value_heads 4, which TP=3 does not split "
            "evenly over its ranks; accepted: a multiple of the node count 3 that splits them: 12")


def test_the_hub_snapshot_in_hf_cache_is_read_at_the_pinned_revision(tmp_path):
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = (tmp_path / "hf" / "hub" / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4" / "snapshots"
                / revision)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"num_attention_heads": 64}))
    refused(run(tmp_path, nodes=3, HF_CACHE=tmp_path / "hf", MODEL_REVISION=revision),
            f"TP=3: {snapshot}/config.json has num_attention_heads 64, which TP=3 does not split "
            "evenly over its ranks; accepted: none with 3 nodes; use a node count that divides 64")
    # no snapshot there (the first run downloads it): nothing to read, vLLM checks at start
    assert run(tmp_path, nodes=3, HF_CACHE=tmp_path / "empty").returncode == 0
