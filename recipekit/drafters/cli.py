"""prepare-drafter's command line: arguments, output, and exit codes (0 ok, 1 I/O, 2 usage, 3 refused)."""

import argparse
from recipekit.one_line_parser import OneLineParser
import json
import sys

from . import catalog
from .errors import Refused, UsageError
from .prepare import DEFAULT_WINDOW, prepare

EXIT_OK, EXIT_IO, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


def _parser():
    parser = OneLineParser(
        prog="prepare-drafter",
        description="Validate a DFlash2 drafter snapshot and write the directory vLLM serves.",
        epilog="exit codes: 0 prepared, 1 I/O error, 2 usage error, 3 snapshot refused",
    )
    parser.add_argument(
        "snapshot_dir",
        nargs="?",
        metavar="SNAPSHOT_DIR",
        help="the downloaded drafter (a Hugging Face cache snapshot or a local directory)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="new directory (or a previous output of this tool) to write"
    )
    parser.add_argument(
        "--window",
        type=int,
        metavar="TOKENS",
        help=f"window for full-attention layers (default {DEFAULT_WINDOW}); "
        "sliding drafters keep their own",
    )
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON object on stdout"
    )
    parser.add_argument("--name", help="repo id to report when the path does not carry one")
    parser.add_argument("--revision", help="commit to record when the path does not carry one")
    parser.add_argument(
        "--licence", metavar="ID", help="licence id to use when the model card names none"
    )
    parser.add_argument(
        "--vllm-root",
        metavar="DIR",
        help="the vLLM tree that will serve the drafter, whose DFlash causality rule is read "
        "(default: the vllm package this Python would import)",
    )
    parser.add_argument(
        "--target-config",
        metavar="PATH",
        help="the target's config.json (or its directory): its vocab_size bounds the mask token "
        "of a drafter that ships no embedding table (default: the drafter's own vocab_size)",
    )
    parser.add_argument(
        "--catalog", action="store_true", help="print the published drafters as JSON and exit"
    )
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)  # argparse exits 2 on its own usage errors
    if args.catalog:
        print(json.dumps(catalog.as_json_list(), indent=2))
        return EXIT_OK
    if not args.snapshot_dir or not args.out:
        parser.error("SNAPSHOT_DIR and --out DIR are required")
    try:
        summary = prepare(
            args.snapshot_dir,
            args.out,
            window=args.window,
            name=args.name,
            revision=args.revision,
            licence_id=args.licence,
            vllm_root=args.vllm_root,
            target_config=args.target_config,
        )
    except Refused as refusal:
        print(f"prepare-drafter: refused: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    except UsageError as error:
        print(f"prepare-drafter: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        print(
            f"prepare-drafter: {error.filename or ''}: {error.strerror or error}", file=sys.stderr
        )
        return EXIT_IO
    for note in summary["notes"]:
        print(f"prepare-drafter: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"drafter: {summary['startup']}")
        print(f"revision: {summary['revision']} ({summary['revision_source']})")
        print(f"prepared: {summary['out']}")
    return EXIT_OK
