"""A real (not DRY_RUN) run.sh and stop.sh against fake docker, ssh and curl on this machine.

Two "nodes": the head's docker calls run directly, the worker's go through
tests/fakes/fake-ssh, and tests/fakes/fake-docker keeps one state file per node, so image
IDs, streaming, container deaths and clean-up can be programmed and checked.
"""

import json
import stat
import time

from tests.unit.test_launcher_support import (
    DRAFTER_PIN,
    FAKE_SSH,
    MODEL_PIN,
    NODES,
    REPO,
    run,
    sealed_bin,
)

HEAD, WORKER = NODES[0], NODES[1]
IMAGE = "glm53-sm121-v11"
IMAGE_ID = "sha256:" + "1" * 64
FAKE_CURL = """#!/bin/sh
# Answers once FAKE_CURL_READY_AFTER polls were made; never when it is unset.
count_file="$FAKE_DOCKER_STATE/curl-count"
count=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
echo "$count" >"$count_file"
[ -n "${FAKE_CURL_READY_AFTER:-}" ] && [ "$count" -ge "$FAKE_CURL_READY_AFTER" ]
"""


def make_cluster(tmp_path, head_images=None, worker_images=None, running=()):
    state = tmp_path / "docker-state"
    state.mkdir()
    images = {IMAGE: {"id": IMAGE_ID, "size": 4096}}
    for node, node_images in (("head", head_images), (WORKER, worker_images)):
        containers = {name: {"labels": ["glm53.launcher=serve"], "status": "running",
                             "argv": [], "inspects": 0}
                      for name in running if node == "head"}
        (state / f"{node}.json").write_text(json.dumps(
            {"images": images if node_images is None else node_images,
             "containers": containers}))
    bin_dir = sealed_bin(tmp_path)
    (bin_dir / "docker").symlink_to(REPO / "tests" / "fakes" / "fake-docker")
    curl = bin_dir / "curl"
    curl.write_text(FAKE_CURL)
    curl.chmod(curl.stat().st_mode | stat.S_IXUSR)
    return state


def serve(tmp_path, state, **settings):
    defaults = {"DRY_RUN": 0, "SSH": str(FAKE_SSH), "FAKE_DOCKER_STATE": state,
                "HF_CACHE": tmp_path / "hf", "POLL_SECONDS": 1, "MODEL_REVISION": MODEL_PIN,
                "DRAFTER_REVISION": DRAFTER_PIN}
    return run(tmp_path, **{**defaults, **settings})


def containers(state, node):
    return json.loads((state / f"{node}.json").read_text())["containers"]


def calls(state):
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def started(state):
    return [call for call in calls(state) if call["argv"][:2] == ["run", "--detach"]]


def test_starts_one_rank_per_node_waits_for_the_api_and_stop_removes_both(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=2,
                   FAKE_PREPARE_STARTUP="incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial), 5 sliding layers, window 2048")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith(f"glm53: ready: http://{HEAD}:8000/v1 after ")
    startup = [line for line in lines if line.startswith("glm53: model ")]
    assert len(startup) == 1
    assert "drafter incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial)" in startup[0]
    assert list(containers(state, "head")) == ["glm53-rank0"]
    assert list(containers(state, WORKER)) == ["glm53-rank1"]
    assert [(call["node"], call["argv"][3]) for call in started(state)] == [
        ("head", "glm53-rank0"), (WORKER, "glm53-rank1")]

    stopped = run(tmp_path, script="stop.sh", SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state, DRY_RUN=0)
    assert stopped.returncode == 0, stopped.stderr
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_a_worker_dying_during_the_wait_stops_every_rank_and_shows_its_log(tmp_path):
    state = make_cluster(tmp_path)
    began = time.monotonic()
    result = serve(tmp_path, state, SPEC="off", FAKE_DOCKER_DIE="glm53-rank1:2")
    assert time.monotonic() - began < 20
    assert result.returncode == 1
    assert f"glm53: last 40 log lines of glm53-rank1 on {WORKER}:" in result.stderr
    assert "glm53-rank1 log line 3" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"glm53: rank 1 (glm53-rank1 on {WORKER}) is exited before the API answered; "
        "every rank was stopped")
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_a_worker_with_another_image_id_is_refused_before_anything_starts(tmp_path):
    other = {IMAGE: {"id": "sha256:" + "2" * 64, "size": 4096}}
    state = make_cluster(tmp_path, worker_images=other)
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 2
    assert result.stderr == (
        f"refused: IMAGE={IMAGE}: on {WORKER} it is sha256:{'2' * 64}, on the head {IMAGE_ID}; "
        f"accepted: one image ID on every node (docker rmi it on {WORKER} and rerun to stream "
        "the head's)\n")
    assert started(state) == []


def test_a_worker_without_the_image_gets_the_heads_copy_streamed(tmp_path):
    state = make_cluster(tmp_path, worker_images={})
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert f"glm53: streaming {IMAGE} to {WORKER} (worker 1)" in result.stdout
    assert f"{IMAGE} to {WORKER}: 0.00 GiB" in result.stderr  # the byte counter (no pv here)
    assert json.loads((state / f"{WORKER}.json").read_text())["images"][IMAGE]["id"] == IMAGE_ID
    assert len(started(state)) == 2


def test_missing_image_and_missing_base_is_refused_with_how_to_get_the_base(tmp_path):
    state = make_cluster(tmp_path, head_images={})
    result = serve(tmp_path, state, SPEC="off")
    assert result.returncode == 2
    assert result.stderr == (
        "refused: BASE_IMAGE=vllm/vllm-openai:glm53-flash-arm64-cu130: not on the head, so "
        "glm53-sm121-v11 cannot be built; get the fork image "
        "vllm/vllm-openai:glm53-flash-arm64-cu130 (docker pull or docker load) and run docker tag "
        "vllm/vllm-openai:glm53-flash-arm64-cu130 vllm/vllm-openai:glm53-flash-arm64-cu130, or set "
        "BASE_IMAGE to a base you have (passed to scripts/build.sh --base)\n")
    assert started(state) == []


def test_a_cluster_already_running_is_refused(tmp_path):
    state = make_cluster(tmp_path, running=["glm53-rank0"])
    result = serve(tmp_path, state, SPEC="off")
    assert result.returncode == 1
    assert result.stderr == f"glm53: already running on {HEAD}: glm53-rank0; run ./stop.sh first\n"
    assert started(state) == []


def test_unpinned_revisions_are_resolved_once_and_recorded(tmp_path):
    state = make_cluster(tmp_path)
    resolved = "fedcba9876543210fedcba9876543210fedcba98"
    result = serve(tmp_path, state, MODEL_REVISION=None, DRAFTER_REVISION=None,
                   FAKE_RESOLVED_SHA=resolved, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    pins = (tmp_path / "pins.env").read_text().splitlines()
    assert pins == [f"nvidia/GLM-5.3-Flash-FP4-Local {resolved}",
                    f"incoai/GLM-5.3-Flash-DFlash2 {resolved}"]
    assert f"glm53: pinned incoai/GLM-5.3-Flash-DFlash2 at {resolved}" in result.stdout
    rank1 = containers(state, WORKER)["glm53-rank1"]["argv"]
    assert rank1[rank1.index("--revision") + 1] == resolved


def test_the_token_reaches_containers_only_as_a_read_only_file(tmp_path):
    state = make_cluster(tmp_path)
    token = tmp_path / "token"
    token.write_text("hf_SECRETVALUE\n")
    result = serve(tmp_path, state, SPEC="off", HF_TOKEN_FILE=token, HF_TOKEN="hf_SECRETVALUE",
                   FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    for call in started(state):
        assert f"type=bind,src={token},dst=/run/secrets/hf_token,readonly" in call["argv"]
        assert "hf_SECRETVALUE" not in json.dumps(call)


def test_no_answer_within_ready_timeout_stops_every_rank(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, SPEC="off", READY_TIMEOUT=2)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "glm53: the API did not answer within READY_TIMEOUT=2 s; every rank was stopped")
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_stop_reports_a_node_it_cannot_reach_and_still_cleans_the_others(tmp_path):
    state = make_cluster(tmp_path, running=["glm53-rank0"])
    unreachable = tmp_path / "unreachable-ssh"
    unreachable.write_text("#!/bin/sh\necho 'ssh: connect to host: No route to host' >&2\nexit 255\n")
    unreachable.chmod(unreachable.stat().st_mode | stat.S_IXUSR)
    result = run(tmp_path, script="stop.sh", SSH=str(unreachable), FAKE_DOCKER_STATE=state,
                 DRY_RUN=0)
    assert result.returncode == 1
    assert f"glm53: could not list containers on {WORKER}" in result.stderr
    assert result.stderr.splitlines()[-1] == "glm53: 1 node(s) could not be cleaned; see above"
    assert containers(state, "head") == {}

