"""EXTRA_ARGS parsed by the serving image's vLLM parser before any rank starts
(launcher/plan/extra_args.py), against fake docker whose `docker run --rm` answers as the probe
would: a rejected flag is refused in one line with nothing started; a parser that cannot be
set up, or a probe that answers nothing, is a note and the run goes on. The probe itself
meets vLLM 0.30.0's own parser in tests/vllm/test_extra_args_probe.py."""

import json

from launcher.plan import commands, extra_args
from tests.unit.test_launcher_lifecycle import make_cluster, serve, started
from tests.unit.test_launcher_support import REPO, dry_run, sealed_bin

PINNED_IMAGE = "glm53-sm121-v13"


def probe_answers(tmp_path, answer: str) -> None:
    """The fake docker, but the probe's `docker run` (its source holds "EXTRA_ARGS's words")
    prints ANSWER and records its argv."""
    docker = sealed_bin(tmp_path) / "docker"
    docker.unlink()
    docker.write_text(
        '#!/bin/sh\ncase "$*" in *"EXTRA_ARGS\'s words"*)\n'
        f'  printf "%s\\n" "$@" > "$FAKE_DOCKER_STATE/probe-argv"\n  echo \'{answer}\'\n  exit 0 ;;\nesac\n'
        f'exec {REPO}/tests/fakes/fake-docker "$@"\n')
    docker.chmod(0o755)


def test_a_flag_the_images_vllm_rejects_is_refused_before_any_rank(tmp_path):
    state = make_cluster(tmp_path)
    probe_answers(tmp_path, json.dumps({"error": "vllm: error: unrecognized arguments: --no-such-flag"}))
    result = serve(tmp_path, state, EXTRA_ARGS="--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"refused: EXTRA_ARGS=--no-such-flag: {PINNED_IMAGE}'s vLLM parser says: vllm: error: "
        "unrecognized arguments: --no-such-flag; accepted: flags its `vllm serve --help` lists")
    assert started(state) == []
    probe = (state / "probe-argv").read_text().splitlines()
    assert probe[:8] == ["run", "--rm", "--network", "none", "--entrypoint", "python3",
                         PINNED_IMAGE, "-c"]
    assert probe[-1] == '["--no-such-flag"]'


def test_flags_the_parser_takes_start_the_ranks(tmp_path):
    state = make_cluster(tmp_path)
    probe_answers(tmp_path, '{"ok": true}')
    result = serve(tmp_path, state, EXTRA_ARGS="--root-path /x", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert len(started(state)) == 2


def test_a_parser_that_cannot_be_set_up_is_a_note_and_the_run_goes_on(tmp_path):
    state = make_cluster(tmp_path)
    probe_answers(tmp_path, '{"skipped": "ModuleNotFoundError: No module named vllm"}')
    result = serve(tmp_path, state, EXTRA_ARGS="--root-path /x", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert ("glm53: EXTRA_ARGS not parsed before the ranks (ModuleNotFoundError: No module named "
            "vllm); the ranks' own vLLM parser reads it") in result.stdout.splitlines()


def test_without_extra_args_nothing_is_parsed(tmp_path):
    state = make_cluster(tmp_path)
    probe_answers(tmp_path, '{"error": "never asked"}')
    assert serve(tmp_path, state, FAKE_CURL_READY_AFTER=1).returncode == 0
    assert not (state / "probe-argv").exists()


def test_dry_run_prints_the_parse_as_a_step_and_runs_it_not(tmp_path):
    stdout = dry_run(tmp_path, EXTRA_ARGS="--root-path '/a b'")
    assert ("docker run --rm --network none --entrypoint python3 glm53-sm121-v13 -c "
            "'<launcher/extra_args_probe.py>' '[\"--root-path\", \"/a b\"]'") in stdout.splitlines()
    assert commands.extra_args_argv("img", ["--x"])[-2] == extra_args.PROBE.read_text()
