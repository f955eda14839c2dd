"""The drafter's safetensors, read by header only: present, and where the mask token's row comes from."""

from safetensors import SafetensorError, safe_open

from .errors import Refused


def weight_files(snapshot_dir):
    files = sorted(snapshot_dir.glob("*.safetensors"))
    if not files:
        raise Refused(
            snapshot_dir,
            "*.safetensors",
            "none",
            "a drafter snapshot holds its weights as safetensors",
            "download the complete snapshot",
        )
    return files


def drafter_embedding_holds_mask_row(files, mask_token_id, hidden_size):
    """True when the drafter ships an embed_tokens table holding the mask token's row; False
    when it ships no table (vLLM then shares the target's); refused when a table lacks the row."""
    for file in files:
        try:
            with safe_open(file, framework="numpy") as weights:
                for name in weights.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if name.endswith("embed_tokens.weight"):
                        shape = weights.get_slice(name).get_shape()
                        if len(shape) == 2 and shape[1] == hidden_size and shape[0] > mask_token_id:
                            return True
                        raise Refused(
                            file,
                            name,
                            list(shape),
                            f"must be [rows > {mask_token_id}, {hidden_size}] to hold the mask token's row",
                            "the drafter needs a mask_embedding.pt or a full embedding table",
                        )
        except SafetensorError as error:
            raise Refused(
                file,
                "safetensors header",
                str(error).splitlines()[0],
                "must be readable",
                "re-download the snapshot",
            ) from None
    return False
