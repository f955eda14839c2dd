"""Run by the engine venv's Python: the full next-token log-softmax of each model directory,
in float64 through transformers, at given positions of given token sequences; and the final
normed hidden state there (what the lm_head multiplies).

    python float64_logprobs.py REQUEST.json ANSWER.json

REQUEST: {"models": [DIR, ...], "sequences": [{"ids": [...], "start": S}, ...]}; ANSWER:
{"logprobs": {DIR: [[[vocab floats] per position >= S] per sequence]}, "hidden": {...}}: the
distribution that predicts ids[j] from ids[:j] for every j >= S.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main(request_path: str, answer_path: str) -> int:
    request = json.load(open(request_path))
    torch.set_grad_enabled(False)
    answer = {"logprobs": {}, "hidden": {}}
    for directory in request["models"]:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64)
        model.eval()
        per_model, hidden_per_model = [], []
        for sequence in request["sequences"]:
            ids = torch.tensor([sequence["ids"]])
            out = model(input_ids=ids, output_hidden_states=True)
            start = sequence["start"]
            logits = out.logits[0, start - 1:-1]
            per_model.append(torch.log_softmax(logits, dim=-1).tolist())
            hidden = out.hidden_states[-1]
            if not torch.allclose(model.lm_head(hidden), out.logits):
                hidden = model.model.norm(hidden)  # a transformers that hands it un-normed
            if not torch.allclose(model.lm_head(hidden), out.logits):
                raise SystemExit("float64_logprobs: no hidden state gives the logits")
            hidden_per_model.append(hidden[0, start - 1:-1].tolist())
        answer["logprobs"][directory] = per_model
        answer["hidden"][directory] = hidden_per_model
    json.dump(answer, open(answer_path, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
