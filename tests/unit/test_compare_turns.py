"""scripts/compare passes the bench's turns phase on: --turn-tokens reaches every boot's bench
command, is saved with the options (a resumed comparison measures the same) and is refused in
one line when the sizes do not grow."""

from pathlib import Path

import pytest

from compare import boot, command
from compare.rundir import Options, RunDir
from launcher.plan.settings import Refused


def bench_argv(options: Options) -> tuple[str, ...]:
    found = boot.measurements("candidate", "http://127.0.0.1:1", options, RunDir(Path("/nowhere"), {}))
    return next(m.argv for m in found if m.key == "bench")


def test_the_turns_phase_reaches_the_bench_only_when_asked():
    asked = bench_argv(Options(turn_tokens=(8192, 32768)))
    assert asked[asked.index("--phase") + 1] == "all,turns"
    assert asked[asked.index("--turn-tokens") + 1] == "8192,32768"
    plain = bench_argv(Options())
    assert plain[plain.index("--phase") + 1] == "all" and "--turn-tokens" not in plain


def test_the_sizes_are_saved_with_the_options():
    opts = command.build_parser().parse_args(["--turn-tokens", "8192,32768,65536"])
    options = command.options_of(opts)
    assert options.turn_tokens == (8192, 32768, 65536)
    assert Options.from_json(options.to_json()) == options
    saved_before_turns = {k: v for k, v in Options().to_json().items() if k != "turn_tokens"}
    assert Options.from_json(saved_before_turns).turn_tokens == ()


@pytest.mark.parametrize("sizes", ["65536,8192", "100", "8k"])
def test_sizes_that_do_not_grow_are_refused(sizes):
    with pytest.raises(Refused, match="not a comma list of growing prompt sizes"):
        command.build_parser().parse_args(["--turn-tokens", sizes])
