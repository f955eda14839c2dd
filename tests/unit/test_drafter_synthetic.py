"""Tiny synthetic DFlash2 drafters for the drafter tests, and a check that they are what they claim.

Shapes follow the published drafters' configs (incoai's and DFlash2-G's model cards) (layer count, taps, attention, mask file); sizes
are shrunk (hidden 64, vocab 512) so a drafter is a few hundred KB and builds in milliseconds.
"""

import json
import zipfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HIDDEN = 64
VOCAB = 512
MASK_TOKEN_ID = 500
INCOAI_COMMIT = "1" * 40
G_COMMIT = "2" * 40
INCOAI_TAPS = [5, 14, 24, 33, 42]
G_TAPS = [5, 9, 14, 19, 24, 28, 33, 38, 42]

_CARD = "---\nlicense: {licence}\nlibrary_name: transformers\n---\n\n# {name}\n\nA synthetic test drafter.\n"


def drafter_config(layers, layer_type, taps, window):
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": VOCAB,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "layer_types": [layer_type] * layers,
        "use_sliding_window": window is not None,
        "sliding_window": window,
        "dflash_config": {
            "target_layer_ids": list(taps),
            "mask_token_id": MASK_TOKEN_ID,
            "block_size": 8,
            "conv_kernel_size": 2,
            "conv_group_size": 16,
            "selector_rank": 8,
            "selector_top_k": 4,
        },
    }


def mask_vector(dtype=torch.bfloat16):
    return (torch.arange(HIDDEN, dtype=torch.float32) / 7 - 3).to(dtype)


def cache_snapshot(root, repo_id, commit):
    """A Hugging Face cache snapshot directory for repo_id at commit (empty)."""
    snapshot = root / "hub" / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
    snapshot.mkdir(parents=True)
    return snapshot


def write_drafter(snapshot, config, licence, *, embed_rows=VOCAB):
    (snapshot / "config.json").write_text(json.dumps(config, indent=2))
    (snapshot / "README.md").write_text(_CARD.format(licence=licence, name=snapshot.name))
    tensors = {
        "fc.weight": torch.zeros(HIDDEN, HIDDEN * len(config["dflash_config"]["target_layer_ids"]))
    }
    if embed_rows:
        tensors["embed_tokens.weight"] = torch.zeros(embed_rows, HIDDEN)
    save_file(tensors, str(snapshot / "model.safetensors"))
    return snapshot


def make_incoai(root, embed_rows=0, **edits):
    """incoai-shaped: 5 sliding layers at window 2048 with a top-level is_causal false, 5 taps,
    neither an embedding table nor mask_embedding.pt (vLLM shares the target's embedding)."""
    config = drafter_config(5, "sliding_attention", INCOAI_TAPS, 2048)
    config["is_causal"] = False
    config.update(edits)
    snapshot = cache_snapshot(root, "incoai/GLM-5.3-Flash-DFlash2", INCOAI_COMMIT)
    return write_drafter(snapshot, config, "cc-by-nc-nd-4.0", embed_rows=embed_rows)


def make_dflash2_g(root, mask_object=None, **edits):
    """DFlash2-G-shaped: 8 full-attention layers, 9 taps, mask in mask_embedding.pt."""
    config = drafter_config(8, "full_attention", G_TAPS, None)
    config.update(edits)
    snapshot = cache_snapshot(root, "canada-quant/GLM-5.3-Flash-DFlash2-G", G_COMMIT)
    write_drafter(snapshot, config, "apache-2.0", embed_rows=0)
    if mask_object is None:
        mask_object = {"embedding": mask_vector(), "mask_token_id": MASK_TOKEN_ID}
    torch.save(mask_object, snapshot / "mask_embedding.pt")
    return snapshot


def rewrite_zip(path, replace=None, compression=zipfile.ZIP_STORED):
    """Rewrite a torch zip with some records replaced (by suffix) and a chosen compression."""
    with zipfile.ZipFile(path) as archive:
        records = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in records:
            for suffix, new_data in (replace or {}).items():
                if name.endswith(suffix):
                    data = new_data
            archive.writestr(name, data)


def test_synthetic_drafters_have_the_published_shapes(tmp_path):
    incoai = make_incoai(tmp_path / "a")
    g = make_dflash2_g(tmp_path / "b")
    incoai_config = json.loads((incoai / "config.json").read_text())
    g_config = json.loads((g / "config.json").read_text())
    assert (
        incoai_config["num_hidden_layers"],
        len(incoai_config["dflash_config"]["target_layer_ids"]),
    ) == (5, 5)
    assert (g_config["num_hidden_layers"], len(g_config["dflash_config"]["target_layer_ids"])) == (
        8,
        9,
    )
    assert incoai_config["is_causal"] is False
    with safe_open(incoai / "model.safetensors", framework="pt") as weights:
        assert "embed_tokens.weight" not in weights.keys()  # noqa: SIM118 (not a dict)
    assert not (incoai / "mask_embedding.pt").exists()
    # The mask file is a real torch.save file that torch's own safe loader accepts.
    state = torch.load(g / "mask_embedding.pt", weights_only=True)
    assert (
        torch.equal(state["embedding"], mask_vector()) and state["mask_token_id"] == MASK_TOKEN_ID
    )
