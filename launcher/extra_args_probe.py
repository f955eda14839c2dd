"""Run inside the serving image (python3 -c, by launcher/plan/extra_args.py): EXTRA_ARGS's words,
given as one JSON list in argv[1], parsed by that image's own `vllm serve` parser after a
placeholder model. Prints one JSON line: {"ok": true}, {"error": "<argparse's message>"}, or
{"skipped": "<why>"} when this vLLM's parser cannot be set up here. Standard library and
vLLM only; nothing is served, loaded or written."""

import contextlib
import io
import json
import sys

words = json.loads(sys.argv[1])
try:
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # no GPU here; the parser needs none
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before vLLM 0.11 it lived in vllm.utils
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.cli.serve import ServeSubcommand

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers())
except Exception as error:  # noqa: BLE001 (any failure to set the parser up is a skip)
    print(json.dumps({"skipped": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
said = io.StringIO()
try:
    with contextlib.redirect_stderr(said):
        parser.parse_args(["serve", "placeholder/model", *words])
except SystemExit as exit_:
    if exit_.code:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        print(json.dumps({"error": lines[-1] if lines else f"exit {exit_.code}"}))
        sys.exit(0)
print(json.dumps({"ok": True}))
