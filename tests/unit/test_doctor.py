"""scripts/doctor against the fake cluster: each state, its findings and its exit code.

The ranks are started by a real run.sh against tests/fakes/fake-docker (two "nodes", the
worker through fake-ssh); the doctor's curl prints the model list a test plants.
"""

import json
import stat

import pytest

from tests.unit.test_launcher_lifecycle import (
    HEAD,
    IMAGE_ID,
    WORKER,
    containers,
    make_cluster,
    plant_meminfo,
    serve,
)
from tests.unit.test_launcher_support import FAKE_SSH, run, sealed_bin

MODELS = {"object": "list", "data": [{"id": "glm-5.3-flash", "object": "model",
                                      "max_model_len": 327680}]}
DOCTOR_CURL = """#!/bin/sh
# With a planted model list the API answers: /health with the planted status (200 unless
# health holds another), /v1/models with the list and a status line (200 unless
# models-status holds another; the config curl read on stdin goes to curl-config);
# otherwise "connection refused" (exit 7).
[ -f "$FAKE_DOCKER_STATE/models.json" ] || exit 7
case "$*" in
  *"/health"*) cat "$FAKE_DOCKER_STATE/health" 2>/dev/null || printf 200 ;;
  *) case "$*" in *"--config -"*) cat >"$FAKE_DOCKER_STATE/curl-config" ;; esac
     if [ -f "$FAKE_DOCKER_STATE/models-status" ]; then
       printf '{"error": "Unauthorized"}\n%s' "$(cat "$FAKE_DOCKER_STATE/models-status")"
     else
       cat "$FAKE_DOCKER_STATE/models.json"; printf '\n200'
     fi ;;
esac
"""


@pytest.fixture(scope="module")
def started_cluster(tmp_path_factory):
    """The node state files of one fake cluster run.sh started (both ranks running)."""
    tmp_path = tmp_path_factory.mktemp("started")
    state = make_cluster(tmp_path)
    started = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1)
    assert started.returncode == 0, started.stderr
    return {node: (state / f"{node}.json").read_text() for node in ("head", WORKER)}, \
        (tmp_path / "api-key").read_text()


@pytest.fixture
def cluster(tmp_path, started_cluster):
    """A copy of the started cluster for one test; returns its state directory."""
    state = make_cluster(tmp_path)
    nodes, key = started_cluster
    for node, text in nodes.items():
        (state / f"{node}.json").write_text(text)
    (tmp_path / "api-key").write_text(key)  # the key file run.sh wrote, 0600 as it wrote it
    (tmp_path / "api-key").chmod(0o600)
    curl = sealed_bin(tmp_path) / "curl"
    curl.unlink()
    curl.write_text(DOCTOR_CURL)
    curl.chmod(curl.stat().st_mode | stat.S_IXUSR)
    return state


def doctor(tmp_path, state, models=MODELS, **settings):
    if models is not None:
        (state / "models.json").write_text(json.dumps(models))
    swappiness = tmp_path / "swappiness"
    swappiness.write_text("60\n")
    settings = {"DRY_RUN": 0, "SSH": str(FAKE_SSH), "FAKE_DOCKER_STATE": state,
                "GLM53_SWAPPINESS": swappiness, **plant_meminfo(tmp_path), **settings}
    return run(tmp_path, script="scripts/doctor", **settings)


def edit_container(state, node, name, **fields):
    path = state / f"{node}.json"
    node_state = json.loads(path.read_text())
    node_state["containers"][name].update(fields)
    path.write_text(json.dumps(node_state))


SHORT_ID = "1" * 12
GROUPS = "shared,mla,kda_o,kda_in,lm_head"
# the defaults' levers (recipe.toml): the kpool fix, INT8 on five target groups, NVFP4 drafter
LEVERS = (f"KPOOL_TAIL_FIX=1 ADAPTIVE_VERIFY=1 ADAPTIVE_VERIFY_TAU=0.3 "
          f"TARGET_WEIGHT_GROUPS_INT8={GROUPS} DRAFT_WEIGHTS=nvfp4")
SPECULATION = f"image {SHORT_ID}, speculative method=dflash, k=7"
RANK_LINES = [
    f"doctor: {HEAD} (head): glm53-rank0 running, {SPECULATION}",
    f"doctor: {HEAD} (head): glm53-rank0 levers: {LEVERS}",
    f"doctor: {WORKER} (worker 1): glm53-rank1 running, {SPECULATION}",
    f"doctor: {WORKER} (worker 1): glm53-rank1 levers: {LEVERS}",
]


MEMORY = ("memory: vm.swappiness 60 (GB10 recipes run 0: swapping unified memory stalls the GPU), "
          "MemAvailable 50.0 GiB, other GPU containers: none")
MEMORY_LINES = [f"doctor: {HEAD} (head): {MEMORY}", f"doctor: {WORKER} (worker 1): {MEMORY}"]


def test_ready(tmp_path, cluster):
    result = doctor(tmp_path, cluster)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == RANK_LINES + MEMORY_LINES + [
        "doctor: API http://127.0.0.1:8000/health answers 200",
        "doctor: API http://127.0.0.1:8000/v1/models answers: model glm-5.3-flash, max_model_len 327680",
        "doctor: state ready (exit 0)"]


def test_a_dead_engine_behind_a_live_api_is_down(tmp_path, cluster):
    (cluster / "health").write_text("503")
    result = doctor(tmp_path, cluster)
    assert result.returncode == 6
    assert result.stdout.splitlines()[-2:] == [
        "doctor: API http://127.0.0.1:8000/health answers 503: the engine is down (vLLM's API "
        "outlives its engine for seconds); ./stop.sh, then ./run.sh",
        "doctor: state down (exit 6)"]


def test_the_memory_report_names_other_gpu_containers_and_can_be_off(tmp_path, cluster):
    path = cluster / "head.json"
    node_state = json.loads(path.read_text())
    node_state["containers"]["comfyui"] = {"labels": [], "status": "running", "inspects": 0,
                                           "argv": ["run", "--gpus", "all", "--name", "comfyui"]}
    path.write_text(json.dumps(node_state))
    result = doctor(tmp_path, cluster)
    assert f"doctor: {HEAD} (head): {MEMORY.replace('containers: none', 'containers: comfyui')}" in result.stdout
    assert f"doctor: {WORKER} (worker 1): {MEMORY}" in result.stdout
    quiet = doctor(tmp_path, cluster, MEM_PREFLIGHT=0)
    assert "memory:" not in quiet.stdout


def test_loading_while_the_api_does_not_answer(tmp_path, cluster):
    result = doctor(tmp_path, cluster, models=None)
    assert result.returncode == 4
    assert result.stdout.splitlines()[-2:] == [
        "doctor: API http://127.0.0.1:8000/health does not answer (yet: a GB10 boot takes 15-21 minutes)",
        "doctor: state loading (exit 4)"]


def test_a_worker_stopped_is_down(tmp_path, cluster):
    edit_container(cluster, WORKER, "glm53-rank1", status="exited")
    result = doctor(tmp_path, cluster)
    assert result.returncode == 6
    assert result.stdout.splitlines()[2:] == [
        f"doctor: {WORKER} (worker 1): glm53-rank1 is exited (image {SHORT_ID}); ./stop.sh, then ./run.sh",
        "doctor: state down (exit 6)"]


def test_an_unreachable_worker_is_down(tmp_path, cluster):
    unreachable = tmp_path / "unreachable-ssh"
    unreachable.write_text("#!/bin/sh\nexit 255\n")
    unreachable.chmod(0o755)
    result = doctor(tmp_path, cluster, SSH=unreachable)
    assert result.returncode == 6
    assert f"doctor: {WORKER} (worker 1): cannot reach it over SSH ({unreachable})" in result.stdout


def test_a_worker_on_another_image_is_a_mismatch(tmp_path, cluster):
    other = "sha256:" + "2" * 64
    edit_container(cluster, WORKER, "glm53-rank1", image_id=other)
    result = doctor(tmp_path, cluster)
    assert result.returncode == 5
    assert result.stdout.splitlines()[-2:] == [
        f"doctor: {WORKER} (worker 1): image {other} differs from the head's {IMAGE_ID}; "
        "./stop.sh, docker rmi glm53-sm121-v13 there, ./run.sh streams the head's",
        "doctor: state mismatch (exit 5)"]


def test_settings_other_than_the_running_ones_are_a_mismatch(tmp_path, cluster):
    result = doctor(tmp_path, cluster, NUM_SPECULATIVE_TOKENS=5, MAX_MODEL_LEN=200000,
                    models={"data": [{"id": "glm-5.3-flash", "max_model_len": 327680}]})
    assert result.returncode == 5
    assert (f"doctor: {HEAD} (head): glm53-rank0 runs speculative method=dflash k=7, the settings "
            "say method=dflash k=5 (SPEC, NUM_SPECULATIVE_TOKENS); restart with the settings it "
            "should have") in result.stdout
    served = doctor(tmp_path, cluster, MAX_MODEL_LEN=200000)
    assert served.returncode == 5
    assert ("doctor: API max_model_len is 327680, the settings say 200000 (MAX_MODEL_LEN)"
            in served.stdout)


def test_missing_when_no_rank_container_exists(tmp_path, cluster):
    for node in ("head", WORKER):
        path = cluster / f"{node}.json"
        node_state = json.loads(path.read_text())
        node_state["containers"] = {}
        path.write_text(json.dumps(node_state))
    result = doctor(tmp_path, cluster)
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        f"doctor: {HEAD} (head): no glm53-rank0 container",
        f"doctor: {WORKER} (worker 1): no glm53-rank1 container",
        "doctor: no rank container on any node; ./run.sh starts them",
        "doctor: state missing (exit 3)"]


def test_the_doctor_changes_nothing(tmp_path, cluster):
    before = {node: containers(cluster, node) for node in ("head", WORKER)}
    assert doctor(tmp_path, cluster).returncode == 0
    new_calls = [json.loads(line)["argv"][0] for line in
                 (cluster / "calls.jsonl").read_text().splitlines()]
    assert set(new_calls) == {"inspect", "image", "ps"}
    after = {node: containers(cluster, node) for node in ("head", WORKER)}
    for node in before:
        for name in before[node]:
            before[node][name].pop("inspects")
            after[node][name].pop("inspects")
    assert after == before


def rank_env(state, node, name):
    """The --env settings rank container NAME on NODE was started with."""
    argv = containers(state, node)[name]["argv"]
    return [argv[i + 1] for i, word in enumerate(argv[:argv.index("--entrypoint")])
            if word == "--env"]


def set_rank_env(state, node, name, env):
    """Rewrite the --env settings of a started rank (as if run.sh had been run otherwise)."""
    path = state / f"{node}.json"
    node_state = json.loads(path.read_text())
    argv = node_state["containers"][name]["argv"]
    cut = argv.index("--entrypoint")
    kept = [word for i, word in enumerate(argv[:cut])
            if word != "--env" and (i == 0 or argv[i - 1] != "--env")]
    node_state["containers"][name]["argv"] = (
        kept + [word for setting in env for word in ("--env", setting)] + argv[cut:])
    path.write_text(json.dumps(node_state))


def test_each_rank_shows_the_levers_its_container_was_started_with(tmp_path, cluster):
    """The doctor reads them from the containers: a rank started without a lever shows it
    off, one started with only the kpool fix shows only that, whatever the settings say."""
    for node, name in (("head", "glm53-rank0"), (WORKER, "glm53-rank1")):
        env = rank_env(cluster, node, name)
        assert "GLM53_KPOOL_TAIL_FIX=1" in env and f"GLM53_INT8_W8A16={GROUPS}" in env
        set_rank_env(cluster, node, name, [word for word in env if not word.startswith(
            ("GLM53_INT8_W8A16=", "GLM53_DRAFT_WEIGHTS="))] + ["GLM53_INT_GROUP_SIZE=64"])
    result = doctor(tmp_path, cluster, TARGET_WEIGHT_GROUPS_INT8="none", DRAFT_WEIGHTS="bf16",
                    INT_GROUP_SIZE="64")
    lines = result.stdout.splitlines()
    verify = "ADAPTIVE_VERIFY=1 ADAPTIVE_VERIFY_TAU=0.3"
    assert (f"doctor: {HEAD} (head): glm53-rank0 levers: KPOOL_TAIL_FIX=1 {verify} "
            "INT_GROUP_SIZE=64") in lines
    assert (f"doctor: {WORKER} (worker 1): glm53-rank1 levers: KPOOL_TAIL_FIX=1 {verify} "
            "INT_GROUP_SIZE=64") in lines
    # DRAFT_WEIGHTS=bf16 sets GLM53_DRAFT_WEIGHTS=bf16, which these ranks were not started with
    assert result.returncode == 5
    assert ("doctor: the ranks run levers other than the settings': DRAFT_WEIGHTS=unset "
            "(against bf16) (the settings' on the right); restart with the settings they "
            "should have") in lines


def test_a_rank_without_levers_says_none(tmp_path, cluster):
    for node, name in (("head", "glm53-rank0"), (WORKER, "glm53-rank1")):
        set_rank_env(cluster, node, name, [word for word in rank_env(cluster, node, name)
                                           if not word.startswith("GLM53_")])
    # the PR-era profile sets no lever (its image is v11; the fake cluster runs the default)
    result = doctor(tmp_path, cluster, PROFILE="seed-pr", IMAGE="glm53-sm121-v13",
                    NUM_SPECULATIVE_TOKENS=7)
    assert result.returncode == 0, result.stdout
    assert (f"doctor: {HEAD} (head): glm53-rank0 levers: none (no GLM53_* variable set)"
            in result.stdout.splitlines())


def test_ranks_whose_levers_differ_are_a_mismatch(tmp_path, cluster):
    """run.sh sets every lever identically on every rank; a worker left with other ones (here
    without the kpool fix and with INT8 on one group) makes the pair compute neither setting."""
    env = rank_env(cluster, WORKER, "glm53-rank1")
    set_rank_env(cluster, WORKER, "glm53-rank1",
                 [word for word in env if not word.startswith(("GLM53_KPOOL_TAIL_FIX=",
                                                               "GLM53_INT8_W8A16="))]
                 + ["GLM53_INT8_W8A16=mla"])
    result = doctor(tmp_path, cluster)
    assert result.returncode == 5
    lines = result.stdout.splitlines()
    assert (f"doctor: {WORKER} (worker 1): glm53-rank1 levers: ADAPTIVE_VERIFY=1 "
            "ADAPTIVE_VERIFY_TAU=0.3 TARGET_WEIGHT_GROUPS_INT8=mla DRAFT_WEIGHTS=nvfp4") in lines
    assert lines[-2:] == [
        f"doctor: {WORKER} (worker 1): glm53-rank1 levers differ from the head's: "
        f"KPOOL_TAIL_FIX=unset (against 1), TARGET_WEIGHT_GROUPS_INT8=mla (against {GROUPS}); "
        "the ranks must agree: ./stop.sh, then ./run.sh",
        "doctor: state mismatch (exit 5)"]


def test_an_unreadable_inspect_fails_closed_in_one_line(tmp_path, cluster):
    fake = sealed_bin(tmp_path) / "docker"
    fake.unlink()
    fake.write_text("#!/bin/sh\necho 'running sha256:1 [\"serve\"]'\n")
    fake.chmod(0o755)
    result = doctor(tmp_path, cluster)
    assert result.returncode == 1
    assert result.stderr == (f"glm53: cannot read docker inspect of glm53-rank0 on {HEAD}: "
                             "running sha256:1 [\"serve\"]\n")


def test_the_doctor_sends_the_key_on_curls_stdin(tmp_path, cluster):
    result = doctor(tmp_path, cluster)
    assert result.returncode == 0, result.stderr
    key = (tmp_path / "api-key").read_text().strip()
    assert (cluster / "curl-config").read_text() == f'header = "Authorization: Bearer {key}"\n'
    assert key not in result.stdout + result.stderr


def test_a_401_says_the_key_file_is_not_the_served_one(tmp_path, cluster):
    (cluster / "models-status").write_text("401")
    result = doctor(tmp_path, cluster)
    assert result.returncode == 5
    assert result.stdout.splitlines()[-2:] == [
        "doctor: API http://127.0.0.1:8000/v1/models answers 401 Unauthorized: the key in "
        f"{tmp_path / 'api-key'} (API_KEY_FILE) is not the one the API was started with; "
        "./stop.sh, then ./run.sh serves that file's key",
        "doctor: state mismatch (exit 5)"]
