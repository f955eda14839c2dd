"""launcher/extra_args_probe.py (what run.sh runs in the serving image to parse EXTRA_ARGS
before any rank starts) against vLLM 0.30.0's own `vllm serve` parser: an unknown flag is
the parser's one-line error, flags it takes are ok. The probe runs as in the image, under
`python3 -c`, after the hiding of torchvision this venv needs (tests/vllm/test_launcher_vllm_args.py)."""

import json
import sys
from importlib import metadata

import pytest

from launcher.plan import extra_args
from tests.vllm.conftest import run_python
from tests.vllm.test_launcher_vllm_args import PARSE_PROBE

HIDE_TORCHVISION = PARSE_PROBE.split("import vllm.platforms")[0]


@pytest.mark.parametrize("words, answer", [
    (["--no-such-flag"], {"error": "vllm: error: unrecognized arguments: --no-such-flag"}),
    (["--root-path", "/it's glm", "--chat-template-content-format=string"], {"ok": True}),
])
def test_the_probe_answers_as_vllms_parser_does(words, answer):
    assert metadata.version("vllm") == "0.30.0"
    source = HIDE_TORCHVISION + extra_args.PROBE.read_text()
    result = run_python([sys.executable, "-c", source, json.dumps(words)],
                        capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == answer
