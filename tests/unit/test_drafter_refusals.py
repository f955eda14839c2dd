"""Every refusal of prepare-drafter: exit 3, one stderr line naming file, field, value and bound, nothing written."""

import os
import pickle
import zipfile

import pytest
import torch

from recipekit.drafters.cli import main
from tests.unit.test_drafter_synthetic import (
    HIDDEN,
    MASK_TOKEN_ID,
    VOCAB,
    make_dflash2_g,
    make_incoai,
    mask_vector,
    rewrite_zip,
)


def refused(capsys, snapshot, tmp_path, *extra):
    """The stderr line of a refused run, after checking the exit code and that nothing was written."""
    out = tmp_path / "served"
    code = main([str(snapshot), "--out", str(out), "--json", *extra])
    captured = capsys.readouterr()
    assert code == 3, captured.err
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("prepare-drafter: refused: ")
    assert not out.exists()
    return captured.err


def dflash(**fields):
    return dict(
        target_layer_ids=[5, 14, 24, 33, 42],
        mask_token_id=MASK_TOKEN_ID,
        block_size=8,
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=8,
        selector_top_k=4,
        **fields,
    )


@pytest.mark.parametrize(
    "edits, expected",
    [
        (
            {"dflash_config": dflash() | {"target_layer_ids": [5, 14, 24, 33, 45]}},
            [
                "dflash_config.target_layer_ids",
                "[5, 14, 24, 33, 45]",
                "tap 45 is outside the target's layers 0 to 44",
            ],
        ),
        (
            {"dflash_config": dflash() | {"target_layer_ids": [-1, 14, 24]}},
            ["dflash_config.target_layer_ids", "tap -1 is outside"],
        ),
        (
            {"dflash_config": dflash() | {"target_layer_ids": [5, 24, 14, 33, 42]}},
            [
                "dflash_config.target_layer_ids",
                "[5, 24, 14, 33, 42]",
                "must be strictly increasing",
            ],
        ),
        (
            {"dflash_config": dflash() | {"target_layer_ids": [5, 5, 14]}},
            ["dflash_config.target_layer_ids", "must be strictly increasing"],
        ),
        (
            {"dflash_config": dflash() | {"target_layer_ids": list(range(17))}},
            ["dflash_config.target_layer_ids", "must hold 1 to 16 taps, has 17"],
        ),
        (
            {"num_hidden_layers": 17, "layer_types": ["sliding_attention"] * 17},
            ["num_hidden_layers = 17", "must be 1 to 16"],
        ),
        ({"num_hidden_layers": 0, "layer_types": []}, ["num_hidden_layers = 0", "must be 1 to 16"]),
        (
            {"architectures": ["DFlashDraftModel"]},
            ["architectures", "DFlashDraftModel", "must be ['DFlash2DraftModel']"],
        ),
        (
            {"dflash_config": dflash() | {"mask_token_id": VOCAB}},
            [f"dflash_config.mask_token_id = {VOCAB}", f"must be a token id in 0 to {VOCAB - 1}"],
        ),
        (
            {"dflash_config": {k: v for k, v in dflash().items() if k != "mask_token_id"}},
            ["mask_token_id = None", "must be a token id"],
        ),
        (
            {"dflash_config": {k: v for k, v in dflash().items() if k != "conv_kernel_size"}},
            ["dflash_config.conv_kernel_size = None", "must be a positive integer"],
        ),
        (
            {"dflash_config": {k: v for k, v in dflash().items() if k != "selector_top_k"}},
            ["dflash_config.selector_top_k = None", "must be a positive integer"],
        ),
        (
            {"dflash_config": dflash() | {"conv_group_size": 24}},
            ["dflash_config.conv_group_size = 24", f"must divide hidden_size {HIDDEN}"],
        ),
        (
            {"layer_types": ["sliding_attention"] * 4 + ["full_attention"]},
            ["layer_types", "must be all sliding or all full attention"],
        ),
        ({"layer_types": None}, ["layer_types = None", "must list the attention of all 5 layers"]),
        (
            {"use_sliding_window": False},
            [
                "sliding_window (use_sliding_window is not true) = None",
                "sliding layers need a positive window",
            ],
        ),
    ],
)
def test_config_past_a_bound_is_refused(tmp_path, capsys, edits, expected):
    snapshot = make_incoai(tmp_path, **edits)
    message = refused(capsys, snapshot, tmp_path)
    assert str(snapshot / "config.json") in message
    for text in expected:
        assert text in message


def test_missing_licence_is_refused_unless_given(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    (snapshot / "README.md").write_text("# no front matter\n")
    assert "license = None" in refused(capsys, snapshot, tmp_path)
    assert (
        main([str(snapshot), "--out", str(tmp_path / "served"), "--licence", "cc-by-nc-nd-4.0"])
        == 0
    )


def test_licence_option_cannot_contradict_the_card(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    assert main([str(snapshot), "--out", str(tmp_path / "served"), "--licence", "apache-2.0"]) == 2
    assert "--licence apache-2.0 contradicts" in capsys.readouterr().err
    assert not (tmp_path / "served").exists()


def test_a_published_drafter_under_another_licence_is_refused(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    (snapshot / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    message = refused(capsys, snapshot, tmp_path)
    assert "license = 'Apache-2.0'" in message and "published under CC BY-NC-ND 4.0" in message


def test_no_table_no_mask_file_and_a_mask_token_outside_the_target_vocabulary_is_refused(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    (snapshot / "mask_embedding.pt").unlink()
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text('{"text_config": {"vocab_size": 400}}')
    message = refused(capsys, snapshot, tmp_path, "--target-config", str(target))
    assert "mask_token_id = 500 refused: must lie inside the target's vocabulary, 0 to 399" in message
    assert f"({target / 'config.json'})" in message and "its mask row is the target's" in message


def test_an_embedding_table_without_the_mask_row_is_refused(tmp_path, capsys):
    snapshot = make_incoai(tmp_path, embed_rows=MASK_TOKEN_ID)
    message = refused(capsys, snapshot, tmp_path)
    assert f"embed_tokens.weight = [{MASK_TOKEN_ID}, 64] refused: must be [rows > {MASK_TOKEN_ID}, 64]" in message


class SystemCall:
    """Unpickling this runs a shell command: what a hostile mask_embedding.pt would do."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_pickle_that_would_call_os_system_is_refused_and_never_runs(tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    snapshot = make_dflash2_g(tmp_path, mask_object={"embedding": SystemCall(f"touch {marker}")})
    with zipfile.ZipFile(snapshot / "mask_embedding.pt") as archive:
        payload = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    pickle.loads(payload)  # the payload is live: plain unpickling runs it
    assert marker.exists()
    marker.unlink()

    message = refused(capsys, snapshot, tmp_path)
    assert (
        "data.pkl global = 'posix.system'" in message or "data.pkl global = 'os.system'" in message
    )
    assert "torch._utils._rebuild_tensor_v2" in message  # the bound: what is allowed
    assert not marker.exists()


@pytest.mark.parametrize(
    "mask_object, expected",
    [
        (
            {"embedding": mask_vector(), "mask_token_id": MASK_TOKEN_ID, "note": "x"},
            "key = \"'note'\"",
        ),
        ({"embedding": mask_vector(), "extra": mask_vector()}, "key = \"'extra'\""),
        ({"mask_token_id": MASK_TOKEN_ID}, "embedding missing"),
        (
            {"embedding": mask_vector(), "mask_token_id": MASK_TOKEN_ID + 1},
            f"mask_token_id = {MASK_TOKEN_ID + 1}",
        ),
        (torch.zeros(HIDDEN + 1), f"embedding shape = [{HIDDEN + 1}]"),
        (torch.zeros(1, HIDDEN), f"embedding shape = [1, {HIDDEN}]"),
        (torch.zeros(2 * HIDDEN)[::2], f"embedding shape = [{HIDDEN}]"),
        (torch.zeros(HIDDEN, dtype=torch.int64), "data.pkl global = 'torch.LongStorage'"),
        ([mask_vector()], "opcode = 'EMPTY_LIST'"),
    ],
)
def test_a_mask_file_outside_the_one_vector_is_refused(tmp_path, capsys, mask_object, expected):
    snapshot = make_dflash2_g(tmp_path, mask_object=mask_object)
    message = refused(capsys, snapshot, tmp_path)
    assert str(snapshot / "mask_embedding.pt") in message
    assert expected in message


def test_a_compressed_mask_file_is_refused(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    rewrite_zip(snapshot / "mask_embedding.pt", compression=zipfile.ZIP_DEFLATED)
    assert "compression 8" in refused(capsys, snapshot, tmp_path)


def test_a_big_endian_mask_file_is_refused(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    rewrite_zip(snapshot / "mask_embedding.pt", replace={"/byteorder": b"big"})
    assert "byteorder = 'big'" in refused(capsys, snapshot, tmp_path)


def test_a_mask_file_with_a_foreign_record_is_refused(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    path = snapshot / "mask_embedding.pt"
    with zipfile.ZipFile(path, "a") as archive:
        prefix = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{prefix}/extra.py", "print('hi')")
    assert f"zip entry = '{prefix}/extra.py'" in refused(capsys, snapshot, tmp_path)


def test_a_legacy_non_zip_mask_file_is_refused(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    torch.save(
        {"embedding": mask_vector()},
        snapshot / "mask_embedding.pt",
        _use_new_zipfile_serialization=False,
    )
    assert "format = 'not a zip'" in refused(capsys, snapshot, tmp_path)


def test_mask_saved_with_pickle_protocol_4_is_still_read(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path, mask_object={"embedding": mask_vector()})
    torch.save({"embedding": mask_vector()}, snapshot / "mask_embedding.pt", pickle_protocol=4)
    assert main([str(snapshot), "--out", str(tmp_path / "served")]) == 0
    capsys.readouterr()
    assert torch.equal(
        torch.load(tmp_path / "served" / "mask_embedding.pt", weights_only=True)["embedding"],
        mask_vector(),
    )
