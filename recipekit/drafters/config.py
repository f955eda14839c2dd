"""A DFlash2 drafter's config.json: read, bounded, and derived into the config vLLM serves.

Field names follow what vLLM (0.28.0 to 0.30.0) reads for DFlash2 drafters: taps in
dflash_config.target_layer_ids, the mask token in dflash_config.mask_token_id (then the
top level), conv_kernel_size / conv_group_size and selector_rank / selector_top_k in
dflash_config, attention from layer_types, use_swa, swa_window_size, sliding_window and
causal (as vLLM's DFlash model code reads them, PR #52816).
"""

import itertools
import json
from dataclasses import dataclass

from .errors import Refused

ARCHITECTURE = "DFlash2DraftModel"
MAX_LAYERS = 16
MAX_TAPS = 16
TARGET_LAYERS = 45  # GLM-5.3-Flash: 34 KDA + 11 DSA/MLA layers
SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class DrafterShape:
    layers: int
    layer_kind: str  # SLIDING or FULL as layer_types says, the same for every layer
    taps: tuple
    mask_token_id: int
    vocab_size: int
    hidden_size: int
    window: int | None  # the window vLLM already serves it at; None: full attention, no window
    causal: bool  # as vLLM resolves it; deriving a window never changes it


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(file, mapping, key, prefix):
    value = mapping.get(key)
    if not _is_int(value) or value < 1:
        raise Refused(
            file,
            prefix + key,
            value,
            "must be a positive integer",
            "this is not a DFlash2 drafter config vLLM can build",
        )
    return value


def load_config(path):
    """config.json as a dict; a file that is not a JSON object is refused."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Refused(
            path,
            "config.json",
            "missing",
            "a drafter snapshot has a config.json",
            "point at the snapshot directory itself",
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise Refused(
            path, "config.json", str(error), "must be valid JSON", "re-download the snapshot"
        ) from None
    if not isinstance(raw, dict):
        raise Refused(
            path,
            "config.json",
            type(raw).__name__,
            "must be a JSON object",
            "re-download the snapshot",
        )
    return raw


def _window_vllm_sees(raw, dflash):
    """(window, field) as vLLM reads it: swa_window_size, else the config object's sliding_window."""
    if "swa_window_size" in dflash:
        return dflash["swa_window_size"], "dflash_config.swa_window_size"
    if raw.get("model_type") == "qwen3" and not raw.get("use_sliding_window"):
        # transformers' Qwen3Config sets sliding_window to None unless use_sliding_window is true
        return None, "sliding_window (use_sliding_window is not true)"
    return raw.get("sliding_window"), "sliding_window"


def _causal(raw, layer_kind, reads_is_causal=True):
    # vLLM's order: top-level is_causal (0.28.0 and v9; not older vLLM), then
    # dflash_config.causal, else causal iff sliding.
    if reads_is_causal and raw.get("is_causal") is not None:
        return bool(raw["is_causal"])
    override = raw["dflash_config"].get("causal")
    if override is not None:
        return bool(override)
    return layer_kind == SLIDING


def read_shape(path, raw, reads_is_causal=True):
    """Bound every field vLLM needs and return the drafter's shape; refuse past any bound.

    ``reads_is_causal``: whether the serving vLLM honours a top-level is_causal
    (recipekit.drafters.engine), so ``causal`` is what that engine will run.
    """
    architectures = raw.get("architectures")
    if architectures != [ARCHITECTURE]:
        raise Refused(
            path,
            "architectures",
            architectures,
            f"must be [{ARCHITECTURE!r}]",
            "use a DFlash2 drafter snapshot",
        )
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise Refused(
            path, "dflash_config", dflash, "must be an object", "use a DFlash2 drafter snapshot"
        )

    layers = raw.get("num_hidden_layers")
    if not _is_int(layers) or not 1 <= layers <= MAX_LAYERS:
        raise Refused(
            path,
            "num_hidden_layers",
            layers,
            f"must be 1 to {MAX_LAYERS}",
            "this drafter is outside what the recipe serves",
        )
    hidden_size = _positive_int(path, raw, "hidden_size", "")
    vocab_size = _positive_int(path, raw, "vocab_size", "")

    taps = dflash.get("target_layer_ids")
    if not isinstance(taps, list) or not all(_is_int(tap) for tap in taps):
        raise Refused(
            path,
            "dflash_config.target_layer_ids",
            taps,
            "must be a list of integers",
            "the drafter must name the target layers it reads",
        )
    if not 1 <= len(taps) <= MAX_TAPS:
        raise Refused(
            path,
            "dflash_config.target_layer_ids",
            taps,
            f"must hold 1 to {MAX_TAPS} taps, has {len(taps)}",
            "this drafter is outside what the recipe serves",
        )
    if any(later <= earlier for earlier, later in itertools.pairwise(taps)):
        raise Refused(
            path,
            "dflash_config.target_layer_ids",
            taps,
            "must be strictly increasing",
            "the drafter's taps are malformed; re-download or fix the config",
        )
    outside = [tap for tap in taps if not 0 <= tap < TARGET_LAYERS]
    if outside:
        raise Refused(
            path,
            "dflash_config.target_layer_ids",
            taps,
            f"tap {outside[0]} is outside the target's layers 0 to {TARGET_LAYERS - 1}",
            "this drafter was not trained for GLM-5.3-Flash",
        )

    mask_field = "dflash_config.mask_token_id"
    mask_token_id = dflash.get("mask_token_id")
    if mask_token_id is None:
        mask_field, mask_token_id = "mask_token_id", raw.get("mask_token_id")
    if not _is_int(mask_token_id) or not 0 <= mask_token_id < vocab_size:
        raise Refused(
            path,
            mask_field,
            mask_token_id,
            f"must be a token id in 0 to {vocab_size - 1}",
            "the drafter must name its mask token inside its vocabulary",
        )

    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        _positive_int(path, dflash, key, "dflash_config.")
    if hidden_size % dflash["conv_group_size"]:
        raise Refused(
            path,
            "dflash_config.conv_group_size",
            dflash["conv_group_size"],
            f"must divide hidden_size {hidden_size}",
            "the drafter config is inconsistent",
        )

    layer_types = raw.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise Refused(
            path,
            "layer_types",
            layer_types,
            f"must list the attention of all {layers} layers",
            "the drafter config must say which layers are sliding",
        )
    kinds = set(map(str, layer_types))
    if not kinds <= {SLIDING, FULL}:
        raise Refused(
            path,
            "layer_types",
            sorted(kinds),
            f"must be {SLIDING!r} or {FULL!r}",
            "this drafter is outside what the recipe serves",
        )
    if len(kinds) != 1:
        raise Refused(
            path,
            "layer_types",
            layer_types,
            "must be all sliding or all full attention",
            "mixed drafters are outside what the recipe serves",
        )
    layer_kind = kinds.pop()

    window = None
    if layer_kind == SLIDING or dflash.get("use_swa"):
        window, window_field = _window_vllm_sees(raw, dflash)
        if not _is_int(window) or window < 1:
            raise Refused(
                path,
                window_field,
                window,
                "sliding layers need a positive window vLLM can read",
                "set dflash_config.swa_window_size (or sliding_window with use_sliding_window)",
            )

    return DrafterShape(
        layers=layers,
        layer_kind=layer_kind,
        taps=tuple(taps),
        mask_token_id=mask_token_id,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        window=window,
        causal=_causal(raw, layer_kind, reads_is_causal),
    )


def served_config(raw, shape, window, provenance):
    """The config vLLM is given: full-attention layers are served as sliding windows of `window`.

    Causality is left as the drafter states it (full-attention layers resolve non-causal in
    vLLM unless the config says otherwise). Sliding drafters keep every field they had.
    `provenance` (source, revision) is recorded under a key of our own, which vLLM's
    config loader carries along and never reads.
    """
    derived = json.loads(json.dumps(raw))
    if shape.window is None:
        dflash = derived["dflash_config"]
        dflash["use_swa"] = True  # vLLM: every layer sliding when no layer is typed sliding
        dflash["swa_window_size"] = window
    derived["recipekit_prepared"] = dict(provenance)
    return derived
