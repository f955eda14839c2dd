"""scripts/doctor: the state of a cluster run.sh started, reading only.

Per node the rank container and its image ID against the head's, the speculative method
and k in each rank's argv, the image levers it was started with (its GLM53_* variables, by
knob: every rank must run the head's, and the head the settings'), the node's
unified-memory facts (vm.swappiness, MemAvailable, other GPU containers; with
MEM_PREFLIGHT=1), and on the head whether vLLM's /health says
the engine is up (a 503 there is a dead engine, which /v1/models hides for seconds) and
/v1/models names the served model and max_model_len the settings say. Safe while serving
(docker inspect, GET /health and GET /v1/models). One line per finding, then the state;
the exit code is the state.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

from launcher.apply import probe_nodes
from launcher.apply.api_key_file import key_of_client
from launcher.apply.remote import Remote
from launcher.plan import clock_record, commands, node_platform, plan, preflight
from launcher.plan.apikey import curl_config
from launcher.plan.checks import Checked
from launcher.plan.data import Launch, rank_container
from launcher.plan.settings import Failed

EXIT_READY, EXIT_MISSING, EXIT_LOADING, EXIT_MISMATCH, EXIT_DOWN = 0, 3, 4, 5, 6
EXIT_UNMEASURED = 7  # --platform: a node's read bandwidth could not be measured
SSH_UNREACHABLE = 255
# What docker prints when the daemon answered that the container is not there (docker
# inspect's "Error: No such object: NAME"; older clients "No such container: NAME"); any
# other failure is Docker itself out of reach (not running, the socket not ours).
_NO_CONTAINER = re.compile(r"No such (object|container)")
DOCKER_FIX = ("`docker info` must work there as this user without sudo (the docker group; "
              "README's Prerequisites)")


def finding(message: str) -> None:
    print(f"doctor: {message}", flush=True)


def speculation_in(args: list[str]) -> tuple[str, int]:
    """(speculative method or "none", k or 0) of a rank's `vllm serve` argv."""
    text = None
    for at, word in enumerate(args):
        if word == "--speculative-config" and at + 1 < len(args):
            text = args[at + 1]
        elif word.startswith("--speculative-config="):
            text = word.partition("=")[2]
    if text is None:
        return "none", 0
    config = json.loads(text)
    return config.get("method") or "none", int(config.get("num_speculative_tokens") or 0)


def docker_failure(result: subprocess.CompletedProcess) -> str:
    """Docker's own last line of why it failed, or its exit status."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"docker exited {result.returncode}"


class Doctor:
    def __init__(self, checked: Checked):
        self.checked = checked
        self.nodes = Remote.of(plan.nodes_of(checked))
        self.launch = Launch(checked, self.nodes, "", "")
        self.present = self.down = self.mismatches = self.unreachable = 0
        self.rank_images: dict[int, str] = {}
        self.rank_levers: dict[int, dict[str, str]] = {}
        # GLM53_* variable -> the knob that sets it (recipe.toml)
        self.lever_knobs = {name: knob.name for knob in checked.recipe.knobs.values()
                            for name in knob.env if name.startswith("GLM53_")}

    def in_recipe_order(self, names) -> list[str]:
        """GLM53_* names in the order of the knobs that set them; unknown ones last, sorted."""
        order = list(self.lever_knobs)
        return sorted(names, key=lambda name: (order.index(name) if name in order
                                               else len(order), name))

    def lever_words(self, levers: dict[str, str]) -> str:
        """A rank's levers as the knobs that set them (KPOOL_TAIL_FIX=1 ...)."""
        return " ".join(f"{self.lever_knobs.get(name, name)}={levers[name]}"
                        for name in self.in_recipe_order(levers))

    def lever_difference(self, found: dict[str, str], wanted: dict[str, str]) -> str:
        """The levers of FOUND that are not WANTED's: `KNOB=value (against value)`, unset
        where a side has no variable."""
        names = self.in_recipe_order(set(found) | set(wanted))
        return ", ".join(f"{self.lever_knobs.get(name, name)}={found.get(name, 'unset')} "
                         f"(against {wanted.get(name, 'unset')})"
                         for name in names if found.get(name) != wanted.get(name))

    def check_rank(self, index: int) -> None:
        container, where = rank_container(index), self.nodes.label(index)
        facts = subprocess.run(self.nodes.argv(index, commands.rank_facts_argv(index)),
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               check=False)
        if facts.returncode == SSH_UNREACHABLE and index > 0:
            finding(f"{where}: cannot reach it over SSH ({' '.join(self.nodes.ssh)}); "
                    f"`{' '.join(self.nodes.ssh)} {self.nodes.addresses[index]} true` must work "
                    "from the head without a password (README's Prerequisites)")
            self.unreachable += 1
            return
        if facts.returncode != 0 and not _NO_CONTAINER.search(facts.stderr):
            finding(f"cannot reach Docker on {self.nodes.addresses[index]} ({docker_failure(facts)}); "
                    f"{DOCKER_FIX}")
            self.unreachable += 1
            return
        if facts.returncode != 0:
            finding(f"{where}: no {container} container")
            self.down += 1
            return
        self.present += 1
        try:
            inspected = json.loads(facts.stdout)
            state, image = str(inspected["status"]), str(inspected["image"])
            env = dict(str(item).partition("=")[::2] for item in inspected["env"] or [])
            args = [str(word) for word in inspected["args"] or []]
        except (ValueError, TypeError, KeyError, AttributeError):
            raise Failed(f"cannot read docker inspect of {container} on "
                         f"{self.nodes.addresses[index]}: {facts.stdout.strip()[:200]}") from None
        self.rank_images[index] = image
        short = image.removeprefix("sha256:")[:12]
        if state != "running":
            finding(f"{where}: {container} is {state} (image {short}); ./stop.sh, then ./run.sh")
            self.down += 1
            return
        try:
            method, k = speculation_in(args)
        except (ValueError, TypeError, AttributeError):
            raise Failed(f"cannot read the argv of {container} on {self.nodes.addresses[index]}") \
                from None
        running = f"method={method} k={k}"
        finding(f"{where}: {container} running, image {short}, speculative method={method}, k={k}")
        expected = (f"method={plan.speculative_method(self.launch) or 'none'} "
                    f"k={plan.speculative_tokens(self.launch)}")
        if running != expected:
            finding(f"{where}: {container} runs speculative {running}, the settings say "
                    f"{expected} (SPEC, NUM_SPECULATIVE_TOKENS); restart with the settings it "
                    "should have")
            self.mismatches += 1
        levers = self.rank_levers[index] = plan.image_levers(env)
        words = self.lever_words(levers) or "none (no GLM53_* variable set)"
        finding(f"{where}: {container} levers: {words}")

    def check_levers(self) -> None:
        """Every running rank must have the head's levers, and the head the settings' (run.sh
        sets them identically on every rank; a rank left from another run does not)."""
        head = self.rank_levers.get(0)
        if head is None:
            return
        for index, levers in self.rank_levers.items():
            if index > 0 and levers != head:
                finding(f"{self.nodes.label(index)}: {rank_container(index)} levers differ "
                        f"from the head's: {self.lever_difference(levers, head)}; the ranks must "
                        "agree: ./stop.sh, then ./run.sh")
                self.mismatches += 1
        wanted = plan.image_levers(plan.rank_plan(self.launch, 0).env)
        if head != wanted:
            finding(f"the ranks run levers other than the settings': "
                    f"{self.lever_difference(head, wanted)} (the settings' on the right); "
                    "restart with the settings they should have")
            self.mismatches += 1

    def check_images(self) -> None:
        """Every running rank must run the head's image, and the head's IMAGE must still be it."""
        head = self.rank_images.get(0)
        if not head:
            return
        image = self.checked["IMAGE"]
        for index, found in self.rank_images.items():
            if index > 0 and found != head:
                finding(f"{self.nodes.label(index)}: image {found} differs from the head's {head}; "
                        f"./stop.sh, docker rmi {image} there, ./run.sh streams the head's")
                self.mismatches += 1
        current = self.nodes.output(0, commands.image_id_argv(image)) or ""
        if current != head:
            finding(f"IMAGE {image} on the head is {current or 'missing'}, the ranks run {head}; "
                    "./stop.sh and ./run.sh to serve it")
            self.mismatches += 1

    def report_memory(self) -> None:
        if self.checked["MEM_PREFLIGHT"] != "1":
            return
        for index in range(len(self.nodes.addresses)):
            facts = preflight.parse(self.nodes.output(index, commands.memory_facts_argv()))
            where = self.nodes.label(index)
            finding(f"{where}: memory: " + (preflight.describe(facts) if facts else "cannot be read"))

    def check_health(self) -> str:
        """"up", "loading" (no answer) or "down" (answers, but not 200), from GET /health."""
        port = self.checked["PORT"]
        url = f"http://127.0.0.1:{port}/health"
        status = self.nodes.output(0, commands.api_health_argv(port))
        if status is None or status in ("", "000"):
            return "loading"
        if status != "200":
            finding(f"API {url} answers {status}: the engine is down (vLLM's API outlives its "
                    "engine for seconds); ./stop.sh, then ./run.sh")
            return "down"
        finding(f"API {url} answers 200")
        return "up"

    def check_api(self) -> bool:
        """Whether the API answers; a model id or length other than the settings' is counted."""
        port = self.checked["PORT"]
        url = f"http://127.0.0.1:{port}/v1/models"
        key = key_of_client(self.checked)
        asked = subprocess.run(commands.api_models_argv(port, key is not None), text=True,
                               input=curl_config(key), capture_output=True, check=False)
        body, _, status = asked.stdout.rpartition("\n")
        if status == "401":
            finding(f"API {url} answers 401 Unauthorized: " + (
                f"the key in {self.checked['API_KEY_FILE']} (API_KEY_FILE) is not the one the "
                "API was started with; ./stop.sh, then ./run.sh serves that file's key" if key
                else "it was started with an API key and API_AUTH=none sends none; set "
                "API_AUTH=key and API_KEY_FILE to the file it was started with"))
            self.mismatches += 1
            return True
        if asked.returncode != 0 or status != "200":
            finding(f"API {url} does not answer (yet: a GB10 boot takes 15-21 minutes)")
            return False
        try:
            first = json.loads(body)["data"][0]
            served, length = first["id"], str(first.get("max_model_len", "unknown"))
        except (ValueError, KeyError, IndexError, TypeError):
            raise Failed(f"{url} answered, but not with a model list") from None
        finding(f"API {url} answers: model {served}, max_model_len {length}")
        expected = self.checked["SERVED_MODEL_NAME"] or self.checked["MODEL"]
        if served != expected:
            finding(f"API serves {served}, the settings say {expected} (SERVED_MODEL_NAME, MODEL)")
            self.mismatches += 1
        if length != self.checked["MAX_MODEL_LEN"]:
            finding(f"API max_model_len is {length}, the settings say "
                    f"{self.checked['MAX_MODEL_LEN']} (MAX_MODEL_LEN)")
            self.mismatches += 1
        return True

    def state(self) -> tuple[str, int]:
        for index in range(len(self.nodes.addresses)):
            self.check_rank(index)
        if self.unreachable:  # what runs there is unknown: never "missing" (./run.sh over it)
            return "down", EXIT_DOWN
        if self.present == 0:
            finding("no rank container on any node; ./run.sh starts them")
            return "missing", EXIT_MISSING
        if self.down:
            return "down", EXIT_DOWN
        self.report_memory()
        self.check_images()
        self.check_levers()
        if self.mismatches:
            return "mismatch", EXIT_MISMATCH
        health = self.check_health()
        if health == "down":
            return "down", EXIT_DOWN
        if health == "loading":
            finding(f"API http://127.0.0.1:{self.checked['PORT']}/health does not answer (yet: a "
                    "GB10 boot takes 15-21 minutes)")
            return "loading", EXIT_LOADING
        if not self.check_api():
            return "loading", EXIT_LOADING
        if self.mismatches:
            return "mismatch", EXIT_MISMATCH
        return "ready", EXIT_READY


def platform_report(checked: Checked, as_json: bool) -> int:
    """--platform: every node's platform probe (launcher/apply/probe_nodes.py), and what run.sh
    locked (launcher/plan/clock_record.py's record); a line a node, or one JSON object."""
    nodes = Remote.of(plan.nodes_of(checked))
    doc = probe_nodes.read_cluster(nodes, commands.platform_probes(
        len(nodes.addresses), checked["IMAGE"], checked.words["DOCKER_ARGS"]))
    doc["clock_lock"] = clock_record.read_record(checked["RUNS_DIR"])
    unmeasured = [node for node in doc["nodes"] if node_platform.bandwidth(node) is None]
    if as_json:
        print(json.dumps(doc), flush=True)
    else:
        for node in doc["nodes"]:
            finding(f"{node_platform.label(node)}: {node_platform.describe(node)}")
        finding(clock_record.describe_record(doc["clock_lock"]))
        outcome = ("bandwidth not measured on " + ", ".join(node["node"] for node in unmeasured)
                   if unmeasured else "measured on every node")
        finding(f"platform {outcome} (exit {EXIT_UNMEASURED if unmeasured else EXIT_READY})")
    return EXIT_UNMEASURED if unmeasured else EXIT_READY


def main(checked: Checked, args: list[str] | None = None) -> int:
    args = args or []
    if "--platform" in args:
        if not shutil.which("docker"):
            raise Failed("docker is not installed on the head")
        return platform_report(checked, "--json" in args)
    for tool in ("docker", "curl"):
        if not shutil.which(tool):
            raise Failed(f"{tool} is not installed on the head")
    state, code = Doctor(checked).state()
    finding(f"state {state} (exit {code})")
    return code
