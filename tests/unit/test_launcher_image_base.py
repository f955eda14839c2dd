"""The serving image's labels on the head (launcher/plan/image_base.py): its base's vLLM release
(`glm53.base.vllm`) and the layers that base provides (`glm53.provided`), read once before
anything reaches a worker. A base of vLLM 0.34.0 or later refuses EXTRA_ENV's
VLLM_USE_V2_MODEL_RUNNER=0 (that release removed the V1 model runner); the start-up line names
what the base provides; an image without the labels is unknown: nothing refused or claimed.

Real run.sh runs against tests/fakes/fake-docker (tests/unit/test_launcher_lifecycle.py's
cluster), which answers the labels inspect from the image's `labels` in its state.
"""

import json

import pytest

from launcher.plan import image_base, plan
from launcher.plan.load import load
from tests.unit.test_launcher_lifecycle import (
    HEAD,
    IMAGE,
    IMAGE_ID,
    WORKER,
    calls,
    containers,
    make_cluster,
    serve,
    started,
)
from tests.unit.test_launcher_support import REPO, dry_run, launcher_env, startup_line

LABELS_ARGV = ["image", "inspect", "--format", "{{json .Config.Labels}}"]
PROVIDED = "v9 v10 v11 v11_dflash_block_drop"
RETIRED = "VLLM_USE_V2_MODEL_RUNNER=0"
# The default IMAGE's switches, as the start-up line names them after the base.
SWITCHES = "KPOOL_TAIL_FIX ADAPTIVE_VERIFY on; verify tau 0.3, max 7"
STARTUP = ("incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial), 5 sliding layers, "
           "window 2048")


def labelled_cluster(tmp_path, labels, worker_images=None):
    """The lifecycle tests' two nodes, IMAGE on the head carrying LABELS (None: no labels at
    all, as an image built before the chain wrote them)."""
    image = {"id": IMAGE_ID, "size": 4096, **({"labels": labels} if labels is not None else {})}
    return make_cluster(tmp_path, head_images={IMAGE: image}, worker_images=worker_images)


def chain_labels(vllm, provided=""):
    """The two labels as recipekit/imagebuild/chain.py writes them, among others it writes."""
    return {"glm53.layer": "v13", "glm53.outcome": "applied", image_base.BASE_VLLM_LABEL: vllm,
            image_base.PROVIDED_LABEL: provided}


def quick_serve(tmp_path, state, **settings):
    """A real run ready at its first poll, without the memory guard's samplers (their
    tests are elsewhere): what this file reads is before the ranks start."""
    return serve(tmp_path, state, READY_CHECK="models", MEM_GUARD=0, FAKE_CURL_READY_AFTER=1,
                 **settings)


def label_reads(state):
    return [call["node"] for call in calls(state) if call["argv"][:-1] == LABELS_ARGV]


def startup(result):
    lines = [line for line in result.stdout.splitlines() if line.startswith("glm53: model ")]
    assert len(lines) == 1, result.stdout
    return lines[0]


def rank_env(state, node, container):
    argv = containers(state, node)[container]["argv"]
    return [argv[at + 1] for at, word in enumerate(argv[:-1]) if word == "--env"]


# ----------------------------------------------------------------------------- the refusal


def refusal_line(vllm, which):
    return (f"refused: EXTRA_ENV={RETIRED}: IMAGE={IMAGE} is built on vLLM {vllm}{which} removed "
            f"the V1 model runner, so {RETIRED} is no longer honoured; accepted: EXTRA_ENV "
            "without it, or an IMAGE built on a base before vLLM 0.34.0\n")


@pytest.mark.parametrize("vllm, which", [("0.34.0", ", which"), ("0.34.1", "; vLLM 0.34.0")])
def test_a_base_of_vllm_0_34_or_later_refuses_the_v1_runner_before_anything_reaches_a_worker(
        tmp_path, vllm, which):
    state = labelled_cluster(tmp_path, chain_labels(vllm, PROVIDED), worker_images={})
    result = quick_serve(tmp_path, state, EXTRA_ENV=f"NCCL_IB_TIMEOUT=22 {RETIRED}")
    assert result.returncode == 2, result.stderr
    assert result.stderr == refusal_line(vllm, which)
    assert started(state) == []
    assert label_reads(state) == ["head"]
    # refused before the image was streamed: the worker has nothing
    assert json.loads((state / f"{WORKER}.json").read_text())["images"] == {}


@pytest.mark.parametrize("labels", [
    chain_labels("0.33.0"),
    chain_labels("0.1.dev20051+g487ecf187"),  # the vendor fork: a dev build, not newer
    None,  # an image built before the labels
], ids=["0.33.0", "fork", "no-labels"])
def test_an_older_fork_or_unlabelled_base_serves_the_v1_runner_setting(tmp_path, labels):
    state = labelled_cluster(tmp_path, labels)
    result = quick_serve(tmp_path, state, EXTRA_ENV=RETIRED, FAKE_PREPARE_STARTUP=STARTUP)
    assert result.returncode == 0, result.stderr
    assert label_reads(state) == ["head"]
    for node, container in (("head", "glm53-rank0"), (WORKER, "glm53-rank1")):
        assert RETIRED in rank_env(state, node, container)
    # nothing claimed of the base: the image phrase is the switches alone
    assert f", image {IMAGE} ({SWITCHES}), nodes {HEAD} {WORKER} (TP=2);" in startup(result)
    assert "provides" not in startup(result)


@pytest.mark.parametrize("vllm", ["0.34.0", "0.34.1", "0.35.0rc1", "0.34.1.dev7+g0123abc"])
def test_the_refusal_covers_every_release_from_0_34_on(vllm):
    base = image_base.parse(json.dumps(chain_labels(vllm)))
    refused = image_base.retired_refusal(IMAGE, base, ["NCCL_IB_TIMEOUT=22", RETIRED])
    assert refused is not None and refused.line.startswith(
        f"refused: EXTRA_ENV={RETIRED}: IMAGE={IMAGE} is built on vLLM {vllm}")


@pytest.mark.parametrize("labels", [
    chain_labels("0.34.0.dev9+gfeedbee"),  # before 0.34.0 as released
    chain_labels("0.34.0rc2"),
    chain_labels("-", PROVIDED),  # the chain could not tell the release
    {},  # an image of no chain at all
    {image_base.BASE_VLLM_LABEL: 34},  # not a string: not the chain's
])
def test_no_refusal_below_0_34_or_where_the_release_is_unknown(labels):
    base = image_base.parse(json.dumps(labels))
    assert image_base.retired_refusal(IMAGE, base, [RETIRED]) is None


def test_an_image_without_labels_is_read_as_unknown(tmp_path):
    """The lifecycle tests' image carries no labels (as one built before the chain wrote
    them): the labels are still read once, on the head, and nothing is refused or claimed."""
    state = make_cluster(tmp_path)
    result = quick_serve(tmp_path, state, EXTRA_ENV=RETIRED)
    assert result.returncode == 0, result.stderr
    assert [call["node"] for call in calls(state) if call["argv"][:-1] == LABELS_ARGV] == ["head"]
    assert f", image {IMAGE} ({SWITCHES}), nodes " in startup(result)


def test_the_startup_line_names_what_the_base_provides_before_the_switches(tmp_path):
    state = labelled_cluster(tmp_path, chain_labels("0.34.0", PROVIDED))
    result = quick_serve(tmp_path, state, FAKE_PREPARE_STARTUP=STARTUP)
    assert result.returncode == 0, result.stderr
    assert (f", image {IMAGE} (base vLLM 0.34.0 provides {PROVIDED}; {SWITCHES}), nodes {HEAD} "
            f"{WORKER} (TP=2);") in startup(result)
    assert label_reads(state) == ["head"]


def planned_line(tmp_path, labels, **settings):
    """The start-up line of the plan once a run read LABELS (as serving says it)."""
    checked = load(launcher_env(tmp_path, **settings))
    base = image_base.parse(json.dumps(labels))
    the_plan = plan.build(checked, plan.nodes_of(checked), REPO).filled(image_id=IMAGE_ID)
    return the_plan.startup.said(checked.drafter.phrase, image_base.startup_phrase(base))


@pytest.mark.parametrize("labels, settings, image", [
    (chain_labels("0.34.0", "v9 v10"), {"SPEC": "off", "KPOOL_TAIL_FIX": 0},
     f"image {IMAGE} (base vLLM 0.34.0 provides v9 v10)"),
    (chain_labels("-", "v9"), {}, f"image {IMAGE} (base provides v9; {SWITCHES})"),
    (chain_labels("0.33.0", ""), {}, f"image {IMAGE} ({SWITCHES})"),
    (chain_labels("0.33.0", ""), {"SPEC": "off", "KPOOL_TAIL_FIX": 0}, f"image {IMAGE}, nodes"),
], ids=["base-alone", "release-unknown", "provides-nothing", "nothing-at-all"])
def test_the_image_phrase(tmp_path, labels, settings, image):
    assert image in planned_line(tmp_path, labels, **settings)


# ----------------------------------------------------------------------------- DRY_RUN


def test_dry_run_prints_the_label_step_and_claims_nothing(tmp_path):
    stdout = dry_run(tmp_path, EXTRA_ENV=RETIRED)
    lines = stdout.splitlines()
    at = lines.index(f"docker image inspect --format '{{{{json .Config.Labels}}}}' {IMAGE}")
    assert lines[at - 1] == (
        f"# labels of {IMAGE} on the head: its base's vLLM release (glm53.base.vllm) and the "
        "layers that base provides (glm53.provided), for the start-up line; an image without "
        f"them: unknown; EXTRA_ENV's {RETIRED} refused on a base of vLLM 0.34.0 or later")
    # after the head's build, before anything is streamed to a worker
    assert lines.index(f"# {WORKER}: {IMAGE} with the head's image ID") > at
    assert f"image {IMAGE} ({SWITCHES}), nodes" in startup_line(stdout)


def test_dry_run_without_a_retired_setting_names_none(tmp_path):
    stdout = dry_run(tmp_path)
    comment = [line for line in stdout.splitlines() if line.startswith(f"# labels of {IMAGE}")]
    assert comment and comment[0].endswith("an image without them: unknown")


# ----------------------------------------------------------------------------- the parts


@pytest.mark.parametrize("older, newer", [
    ("0.33.0", "0.34.0"), ("0.34.0rc1", "0.34.0"), ("0.34.0.dev3", "0.34.0rc1"),
    ("0.34.0", "0.34.0.post1"), ("0.34.0.post1", "0.34.1"), ("0.34", "0.34.1"),
    ("0.1.dev20051+g487ecf187", "0.33.0"), ("0.34.0a1", "0.34.0b1"), ("0.9.2", "0.10.0"),
])
def test_versions_order_as_pep_440_orders_them(older, newer):
    assert image_base.version_key(older) < image_base.version_key(newer)
    assert not image_base.at_least(older, newer) and image_base.at_least(newer, older)


def test_equal_releases_and_unreadable_versions():
    assert image_base.version_key("0.34") == image_base.version_key("0.34.0")
    assert image_base.at_least("0.34.0+cu130", "0.34.0")
    for text in ("-", "", "latest", "0.34.0 (fork)"):
        assert image_base.version_key(text) is None
        assert not image_base.at_least(text, "0.34.0")


@pytest.mark.parametrize("text", [None, "", "null", "4096", "[]", "not json", '{"other": "x"}'])
def test_anything_but_the_labels_reads_as_unknown(text):
    assert image_base.parse(text) == image_base.UNKNOWN
    assert image_base.retired_refusal(IMAGE, image_base.parse(text), [RETIRED]) is None
    assert image_base.startup_phrase(image_base.parse(text)) == ""


def test_the_labels_read_as_written():
    base = image_base.parse(json.dumps(chain_labels("0.34.0", PROVIDED)))
    assert base == image_base.ImageBase("0.34.0", tuple(PROVIDED.split()), labelled=True)
    assert image_base.parse(json.dumps(chain_labels("0.33.0", ""))).provided == ()
    # only the exact word is refused: another value, or another variable, is not
    for words in (["VLLM_USE_V2_MODEL_RUNNER=1"], ["VLLM_USE_V2_MODEL_RUNNER=00"],
                  ["VLLM_LOGGING_LEVEL=DEBUG"], []):
        assert image_base.retired_refusal(IMAGE, base, words) is None


def test_docs_launcher_quotes_the_refusal_and_the_phrase_as_the_launcher_says_them():
    text = " ".join((REPO / "docs" / "launcher.md").read_text().split())
    assert " ".join(refusal_line("0.34.0", ", which").split()) in text
    assert f"`image {IMAGE} (base vLLM 0.34.0 provides {PROVIDED}; {SWITCHES})`" in text
