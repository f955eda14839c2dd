"""Write the served mask_embedding.pt: only the vector, its token id and the source revision.

vLLM reads this file with torch.load(weights_only=True) and takes `embedding`, checking
`mask_token_id` against the config; torch.save is used so the format is torch's own.
"""

from .errors import UsageError


def write_mask_embedding(path, mask, mask_token_id, source_revision):
    try:
        import torch
    except ImportError:
        raise UsageError(
            "writing mask_embedding.pt needs torch: run prepare-drafter where torch "
            "is installed (the serving image has it)"
        ) from None
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        mask.dtype
    ]
    embedding = torch.frombuffer(bytearray(mask.data), dtype=dtype).clone()
    torch.save(
        {
            "embedding": embedding,
            "mask_token_id": mask_token_id,
            "source_revision": source_revision,
        },
        path,
    )
