"""prepare-drafter on incoai- and DFlash2-G-shaped drafters: what it writes and what it reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipekit.drafters import catalog
from recipekit.drafters.cli import main
from tests.timing import HANG_GUARD_S
from tests.unit.test_drafter_synthetic import (
    G_COMMIT,
    G_TAPS,
    INCOAI_COMMIT,
    INCOAI_TAPS,
    MASK_TOKEN_ID,
    make_dflash2_g,
    make_incoai,
    mask_vector,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    """(exit code, stdout, stderr) of prepare-drafter in this process."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def prepared(capsys, snapshot, out, *extra):
    code, stdout, stderr = run(capsys, snapshot, "--out", out, "--json", *extra)
    assert code == 0, stderr
    return json.loads(stdout)


def tree_state(root):
    """Every path under root with its bytes (or link target), to prove nothing changed."""
    state = {}
    for path in sorted(root.rglob("*")):
        state[str(path.relative_to(root))] = (
            os.readlink(path)
            if path.is_symlink()
            else (path.read_bytes() if path.is_file() else "dir")
        )
    return state


def test_incoai_shape_passes_unchanged(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    before = tree_state(snapshot)
    out = tmp_path / "served"
    summary = prepared(capsys, snapshot, out)

    derived = json.loads((out / "config.json").read_text())
    provenance = derived.pop("recipekit_prepared")
    assert derived == json.loads((snapshot / "config.json").read_text())
    assert provenance["source_revision"] == INCOAI_COMMIT
    assert summary.pop("causal_rule").startswith("top-level is_causal, then dflash_config.causal")
    assert summary == {
        "drafter": "incoai/GLM-5.3-Flash-DFlash2",
        "licence": "CC-BY-NC-ND-4.0",
        "licence_name": "CC BY-NC-ND 4.0",
        "licence_recognised": True,
        "non_commercial": True,
        "layers": 5,
        "full_attention_layers": 0,
        "sliding_layers": 5,
        "taps": INCOAI_TAPS,
        "window": 2048,
        "window_added": False,
        "causal": False,
        "mask_token_id": MASK_TOKEN_ID,
        "mask_source": "target-embedding",
        "revision": INCOAI_COMMIT,
        "revision_source": "hf-cache-path",
        "source": str(snapshot),
        "out": str(out),
        "startup": "incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial), 5 sliding "
        "layers, window 2048, non-causal, mask row from the target's embedding table",
        "notes": [],
    }
    # Weights and card are links into the snapshot, not copies; the snapshot is untouched.
    for name in ("model.safetensors", "README.md"):
        assert (out / name).is_symlink() and os.readlink(out / name) == str(snapshot / name)
    assert not (out / "mask_embedding.pt").exists()
    assert tree_state(snapshot) == before


def test_dflash2_g_shape_is_served_at_a_2048_window(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    before = tree_state(snapshot)
    out = tmp_path / "served"
    summary = prepared(capsys, snapshot, out)

    derived = json.loads((out / "config.json").read_text())
    assert derived["dflash_config"]["use_swa"] is True
    assert derived["dflash_config"]["swa_window_size"] == 2048
    assert derived["layer_types"] == ["full_attention"] * 8  # the drafter's own description is kept
    assert derived["recipekit_prepared"]["source_revision"] == G_COMMIT
    assert {
        key: summary[key]
        for key in (
            "licence",
            "non_commercial",
            "layers",
            "full_attention_layers",
            "sliding_layers",
            "taps",
            "window",
            "window_added",
            "causal",
            "mask_source",
            "revision",
        )
    } == {
        "licence": "Apache-2.0",
        "non_commercial": False,
        "layers": 8,
        "full_attention_layers": 8,
        "sliding_layers": 0,
        "taps": G_TAPS,
        "window": 2048,
        "window_added": True,
        "causal": False,
        "mask_source": "mask_embedding.pt",
        "revision": G_COMMIT,
    }
    assert summary["startup"] == (
        "canada-quant/GLM-5.3-Flash-DFlash2-G (Apache-2.0), "
        "8 full-attention layers served at a 2048-token window, non-causal, mask row from mask_embedding.pt"
    )
    assert os.readlink(out / "model.safetensors") == str(snapshot / "model.safetensors")
    assert tree_state(snapshot) == before


def test_mask_embedding_read_back_equals_the_source(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    out = tmp_path / "served"
    prepared(capsys, snapshot, out)
    assert not (out / "mask_embedding.pt").is_symlink()
    state = torch.load(out / "mask_embedding.pt", weights_only=True)  # how vLLM reads it
    assert set(state) == {"embedding", "mask_token_id", "source_revision"}
    assert state["embedding"].dtype == torch.bfloat16
    assert torch.equal(state["embedding"], mask_vector())
    assert state["mask_token_id"] == MASK_TOKEN_ID
    assert state["source_revision"] == G_COMMIT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bare_tensor_masks_of_each_float_type_are_accepted(tmp_path, capsys, dtype):
    snapshot = make_dflash2_g(tmp_path, mask_object=mask_vector(dtype))
    out = tmp_path / "served"
    prepared(capsys, snapshot, out)
    state = torch.load(out / "mask_embedding.pt", weights_only=True)
    assert state["embedding"].dtype == dtype and torch.equal(state["embedding"], mask_vector(dtype))


def test_window_option_sets_the_served_window(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    summary = prepared(capsys, snapshot, tmp_path / "served", "--window", "1024")
    assert summary["window"] == 1024
    assert (
        json.loads((tmp_path / "served" / "config.json").read_text())["dflash_config"][
            "swa_window_size"
        ]
        == 1024
    )
    assert "8 full-attention layers served at a 1024-token window, non-causal" in summary["startup"]


def test_window_option_leaves_a_sliding_drafter_at_its_own_window_and_says_so(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    code, stdout, stderr = run(
        capsys, snapshot, "--out", tmp_path / "served", "--window", "4096", "--json"
    )
    assert code == 0
    summary = json.loads(stdout)
    assert summary["window"] == 2048 and summary["window_added"] is False
    assert summary["notes"] == [
        (
            "--window 4096 applies to full-attention layers only; "
            "incoai/GLM-5.3-Flash-DFlash2 keeps the window its config gives, 2048"
        )
    ]
    assert stderr == f"prepare-drafter: note: {summary['notes'][0]}\n"
    derived = json.loads((tmp_path / "served" / "config.json").read_text())
    del derived["recipekit_prepared"]
    assert derived == json.loads((snapshot / "config.json").read_text())


def test_revision_comes_from_the_option_or_is_unknown(tmp_path, capsys):
    plain = tmp_path / "plain-drafter"
    make_incoai(tmp_path).rename(plain)
    summary = prepared(
        capsys,
        plain,
        tmp_path / "a",
        "--revision",
        "abc123",
        "--name",
        "incoai/GLM-5.3-Flash-DFlash2",
    )
    assert (summary["drafter"], summary["revision"], summary["revision_source"]) == (
        "incoai/GLM-5.3-Flash-DFlash2",
        "abc123",
        "option",
    )
    summary = prepared(capsys, plain, tmp_path / "b")
    assert (summary["drafter"], summary["revision"], summary["revision_source"]) == (
        "plain-drafter",
        "unknown",
        "unknown",
    )


def test_revision_option_contradicting_the_cache_path_is_a_usage_error(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    code, _, stderr = run(capsys, snapshot, "--out", tmp_path / "served", "--revision", "deadbeef")
    assert code == 2 and "contradicts the snapshot path" in stderr


def test_rerun_replaces_a_previous_output(tmp_path, capsys):
    snapshot = make_dflash2_g(tmp_path)
    out = tmp_path / "served"
    prepared(capsys, snapshot, out)
    summary = prepared(capsys, snapshot, out, "--window", "512")
    assert summary["window"] == 512
    assert json.loads((out / "config.json").read_text())["dflash_config"]["swa_window_size"] == 512
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".")
    ] == []  # no temporaries left


def test_out_holding_a_users_file_is_refused_and_the_file_kept(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    out = tmp_path / "served"
    prepared(capsys, snapshot, out)
    (out / "notes.txt").write_text("mine")
    code, _, stderr = run(capsys, snapshot, "--out", out)
    assert code == 2 and "notes.txt" in stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_out_that_is_not_ours_or_overlaps_the_snapshot_is_refused(tmp_path, capsys):
    snapshot = make_incoai(tmp_path)
    existing = tmp_path / "existing"
    existing.mkdir()
    code, _, stderr = run(capsys, snapshot, "--out", existing)
    assert code == 2 and "not a previous prepare-drafter output" in stderr
    code, _, stderr = run(capsys, snapshot, "--out", snapshot / "served")
    assert code == 2 and "overlaps the snapshot" in stderr
    assert not (snapshot / "served").exists()


def test_catalog_names_both_published_drafters_without_invented_revisions():
    assert catalog.DRAFTERS["incoai"].repo_id == "incoai/GLM-5.3-Flash-DFlash2"
    assert catalog.DRAFTERS["incoai"].licence_name == "CC BY-NC-ND 4.0"
    assert catalog.DRAFTERS["incoai"].non_commercial is True
    assert catalog.DRAFTERS["dflash2-g"].repo_id == "canada-quant/GLM-5.3-Flash-DFlash2-G"
    assert catalog.DRAFTERS["dflash2-g"].licence == "Apache-2.0"
    # The seed's verified run pinned incoai (its PR #1); no commit is known for DFlash2-G.
    assert catalog.DRAFTERS["incoai"].revision == "7d74cdd881ed7e32c31175984a67823127b66cfe"
    assert catalog.DRAFTERS["dflash2-g"].revision is None


def test_the_script_prints_exactly_one_json_object(tmp_path):
    snapshot = make_dflash2_g(tmp_path)
    result = subprocess.run(
        [
            str(REPO_ROOT / "scripts" / "prepare-drafter"),
            str(snapshot),
            "--out",
            str(tmp_path / "served"),
            "--json",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert json.loads(result.stdout)["out"] == str(tmp_path / "served")
