"""Carrying out a run's plan (launcher/plan/data.py, built once before this starts): refuse
over a running cluster, images on every node, pins, the drafter, the ranks, the memory guard
and the readiness wait; and stop.sh's. Every command is the plan's, run as it stands or with
a fact the run found filled into its hole (Plan.filled). Stops at the first problem with
nothing left running (a run that started ranks and did not reach ready removes them on the
way out, Ctrl-C included).
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

from launcher.apply import host_levers, memguard, probe_nodes, steps
from launcher.apply.api_key_file import existing_key, judge_key_file, key_of_run, server_env_file
from launcher.apply.remote import Remote
from launcher.plan import extra_args, gpus, image_base, node_platform, pins, preflight
from launcher.plan import scan_verdict
from launcher.plan.apikey import curl_config
from launcher.plan.data import (
    API_KEY_ENV_FILE,
    IMAGE_BYTES,
    LISTED_IDS,
    LOG_TAIL_LINES,
    Plan,
    StopPlan,
    with_words,
)
from launcher.plan.checks import Checked
from launcher.plan.memory_phases import FLOOR_KNOBS, PHASES, interval
from launcher.plan.settings import Failed, Refused, RefusedAbove, refusal
from recipekit import baselock

PROGRESS_EVERY_SECONDS = 30
# scripts/scan-checkpoint's exit for a directory it cannot read (any other failure is the
# scan's own: its usage, its tool environment)
SCAN_UNREADABLE = 3
# The programs a run needs on the head itself (-> why, when it is not plain)
NEEDED_ON_THE_HEAD = {"docker": "", "curl": " (the readiness wait polls the API with it)"}


def say(message: str) -> None:
    print(f"glm53: {message}", flush=True)


def warn(message: str) -> None:
    print(f"glm53: {message}", file=sys.stderr, flush=True)


def stop_all_ranks(nodes: Remote, removals) -> int:
    """Removes every serve container on every node (also ones a rank left behind), by each
    node's (listing, removal) of REMOVALS; a node that cannot be reached is reported and
    counted, and the others still stopped."""
    failures = 0
    for index, (node, (listing, removal)) in enumerate(zip(nodes.addresses, removals)):
        listed = nodes.run(index, listing, capture=True)
        if listed.returncode != 0:
            warn(f"could not list containers on {node}")
            failures += 1
            continue
        ids = listed.stdout.split()
        if ids and nodes.run(index, with_words(removal, {LISTED_IDS: ids}),
                             capture=True).returncode != 0:
            warn(f"could not remove {' '.join(ids)} on {node}")
            failures += 1
    return failures


def stop(stop_plan: StopPlan, dry_run: bool) -> int:
    """stop.sh's plan carried out (DRY_RUN: printed); a clock record that could not be read
    is said once the containers are gone."""
    if dry_run:
        if stop_plan.record_problem:
            raise Failed(stop_plan.record_problem)
        sys.stdout.write(steps.render(stop_plan.nodes, steps.stop_run_steps(stop_plan)))
        return 0
    nodes = Remote.of(stop_plan.nodes)
    failures = stop_all_ranks(nodes, stop_plan.removals)
    if stop_plan.record_problem:
        raise Failed(stop_plan.record_problem)
    clocks = host_levers.reset(stop_plan.clock_resets, stop_plan.runs_dir, say, warn)
    if failures or clocks:
        raise Failed(f"{failures + clocks} node(s) could not be cleaned; see above")
    say(f"stopped every rank on {' '.join(nodes.addresses)}")
    return 0


def run(the_plan: Plan, served: dict | None = None) -> int:
    """THE_PLAN carried out (DRY_RUN=1: printed); SERVED (a dict), when given, receives what
    was served once the ranks are ready: the image ID and the model's and drafter's
    revisions."""
    if the_plan.launch["DRY_RUN"] == "1":
        scanned = judge_on_this_host(the_plan)
        sys.stdout.write(steps.render(the_plan.launch.nodes, steps.run_steps(the_plan, scanned)))
        return 0
    serving = Serving(the_plan)
    code = serving.serve()
    if served is not None:
        launch = serving.plan.launch
        served.update(image_id=launch.image_id, model_revision=launch.model_pin,
                      drafter_revision=launch.drafter_pin)
    return code


def _interrupted(signum, frame):
    raise KeyboardInterrupt


# ---------------------------------------------------------------- judged the same in DRY_RUN


def judge_on_this_host(the_plan: Plan) -> str | None:
    """DRY_RUN's share of the run's refusals: each one the run makes of what this host holds,
    in the run's order and by the run's own code (the key file, the head's token file,
    recipe.lock, a local MODEL's scan), so that DRY_RUN refuses what the run would refuse.
    What only the nodes can answer (Docker, GPUs, memory, the images) stays a printed step.
    Returns the scan's summary line for a local MODEL (None when there is no scan)."""
    checked = the_plan.launch.checked
    judge_key_file(checked)
    token = checked["HF_TOKEN_FILE"]
    if token and not os.access(token, os.R_OK):
        raise token_refusal(token, checked.nodes[0])
    read_base_lock(the_plan.base_lock)
    if not the_plan.host_scan:
        return None
    scanned = subprocess.run(the_plan.host_scan, text=True, stdin=subprocess.DEVNULL,
                             capture_output=True, check=False)
    if scanned.returncode not in (0, SCAN_UNREADABLE):  # this host's problem, not the model's
        said = (scanned.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failed(f"DRY_RUN could not run the checkpoint scan of MODEL={checked['MODEL']} on "
                     f"this host ({said}); fix that, or set CHECKPOINT_SCAN=off for the dry run")
    return judge_scan(the_plan, scanned, "on this host", lambda summary: None)


def token_refusal(token: str, where: str) -> Refused:
    return refusal("HF_TOKEN_FILE", token, f"not a readable file on {where}; accepted: the token "
                   "file at this path on every node, or empty")


def read_base_lock(path: Path) -> baselock.BaseLock:
    """recipe.lock (PATH) as the run reads it before any image is looked at; one that is not
    the lock's TOML is refused in its one line."""
    try:
        return baselock.BaseLock.read(path)
    except baselock.LockError as error:
        raise Refused(f"refused: {error}") from None


def judge_scan(the_plan: Plan, scanned: subprocess.CompletedProcess, where: str,
               tell) -> str:
    """A local MODEL's scan (scripts/scan-checkpoint --json, run WHERE) judged for the run's
    IMAGE: its summary given to TELL first, then a scan that failed, or gate/up scales IMAGE
    does not correct, refused (said loudly with CHECKPOINT_SCAN=warn). Returns the summary."""
    checked = the_plan.launch.checked
    image = checked["IMAGE"]
    if scanned.returncode == scan_verdict.REFUSED:  # a damaged checkpoint: warn cannot boot it
        problem, accepted = scan_verdict.failure(image, scanned.returncode, scanned.stderr, where)
        raise refusal("MODEL", checked["MODEL"], f"{problem}; accepted: {accepted} "
                      "(CHECKPOINT_SCAN=warn does not boot it: vLLM would serve that part from "
                      "uninitialised memory)")
    if scanned.returncode != 0:
        scan_problem(checked, *scan_verdict.failure(image, scanned.returncode, scanned.stderr,
                                                    where))
        return f"the scan {where} failed"
    try:
        verdict = scan_verdict.judge(json.loads(scanned.stdout), image, checked.recipe,
                                     the_plan.chain_image)
    except (ValueError, scan_verdict.BadReport) as error:
        scan_problem(checked, f"the checkpoint scan {where} printed no report it reads ({error})",
                     "CHECKPOINT_SCAN=off to boot without the scan")
        return f"the scan {where} printed no report"
    tell(verdict.summary)
    if verdict.problem:
        scan_problem(checked, verdict.problem, f"{verdict.accepted}, or CHECKPOINT_SCAN=warn to "
                     "boot anyway")
    return verdict.summary


def scan_problem(checked: Checked, problem: str, accepted: str) -> None:
    if checked["CHECKPOINT_SCAN"] == "warn":
        warn(f"WARNING: MODEL={checked['MODEL']}: {problem}; booting anyway "
             "(CHECKPOINT_SCAN=warn)")
        return
    raise refusal("MODEL", checked["MODEL"], f"{problem}; accepted: {accepted}")


class Serving:
    def __init__(self, the_plan: Plan):
        # Filled in as the run finds the image ID and resolves the pins (in the image).
        self.plan = the_plan
        self.checked, self.nodes = the_plan.launch.checked, Remote.of(the_plan.launch.nodes)
        self.ranks_started = False
        self.ready = False
        self.guard: memguard.MemoryGuard | None = None
        self.run_dir: Path | None = None
        self.api_key: str | None = None
        self.base = image_base.UNKNOWN  # what IMAGE's labels say of its base (ensure_images)
        self.clocks_locked = False  # GPU_CLOCK_MHZ asked of a node (recorded, to be reset)

    def __getitem__(self, name: str) -> str:
        return self.checked[name]

    def serve(self) -> int:
        for tool, why in NEEDED_ON_THE_HEAD.items():
            if not shutil.which(tool):
                raise Failed(f"{tool} is not installed on the head{why}")
        self.api_key = existing_key(self.checked)  # a loose key file: refused first
        self.check_no_running_ranks()
        self.check_gpus()
        # a new key after the read-only checks, so that their refusals leave no file behind
        self.api_key = self.api_key or key_of_run(self.checked, say)
        self.prepare_nodes()
        self.check_boot_memory()
        self.plan = self.plan.filled(image_id=self.ensure_images())
        self.prepare_jit_cache()
        self.scan_checkpoint()
        resolved = {repo: self.resolve_and_record(repo, argv)
                    for repo, argv in self.plan.resolve.items()}
        self.plan = self.plan.filled(model_pin=resolved.get(self["MODEL"]),
                                     drafter_pin=resolved.get(self.checked.drafter.repo_id))
        phrase = self.prepare_drafter_everywhere()
        say(self.plan.startup.said(phrase, image_base.startup_phrase(self.base)))
        signal.signal(signal.SIGTERM, _interrupted)
        try:
            # An earlier run's exited ranks were kept for their logs until nothing can refuse.
            stop_all_ranks(self.nodes, self.plan.removals)
            self.lock_clocks()
            self.compact_memory()
            self.start_ranks()
            self.start_memory_guard()
            self.wait_until_ready()
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stop_memory_guard()
            if self.ranks_started and not self.ready:
                warn("start-up did not finish; stopping every rank")
                stop_all_ranks(self.nodes, self.plan.removals)
            if self.clocks_locked and not self.ready:
                warn("start-up did not finish; resetting the GPU clocks it locked")
                host_levers.reset(self.plan.clock_resets, self["RUNS_DIR"], say, warn)
        if self.plan.self_check:
            self.self_check()
        return 0

    def self_check(self) -> None:
        """One Korean answer judged (launcher/apply/selfcheck.py prints its line and any warning);
        whatever it finds, the ranks keep running. Ctrl-C ends the check, not the server."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.nodes.run(0, self.plan.self_check)
        except KeyboardInterrupt:
            warn("self-check interrupted; the ranks keep running (./stop.sh stops them)")

    # ------------------------------------------------------------------ before the ranks

    def check_no_running_ranks(self) -> None:
        """Refuses to start over a cluster that is already up (exited leftovers stay until the
        ranks start, so that a run refused before then leaves every container as it was)."""
        for node in self.plan.nodes:
            listed = self.nodes.run(node.index, node.running, capture=True)
            if listed.returncode != 0:
                raise Failed(f"cannot reach Docker on {node.address}")
            names = listed.stdout.split()
            if names:
                raise Failed(f"already running on {node.address}: {' '.join(names)}; run "
                             "./stop.sh first")

    def check_gpus(self) -> None:
        """Every node has TP / nodes GPUs; nothing counted at one rank a node."""
        for node in self.plan.nodes:
            if node.count_gpus:
                gpus.judge(self.nodes.output(node.index, node.count_gpus),
                           self.nodes.label(node.index), self["TP"], len(self.plan.nodes))

    def prepare_nodes(self) -> None:
        """Every node needs the cache directory (a bind mount's source must exist) and, when
        set, the token file at the same path."""
        token = self["HF_TOKEN_FILE"]
        for node in self.plan.nodes:
            if self.nodes.run(node.index, node.make_hf_cache).returncode != 0:
                raise Failed(f"cannot create HF_CACHE={self['HF_CACHE']} on {node.address}")
            if node.read_token and not self.readable(node.index, node.read_token, token):
                raise token_refusal(token, node.address)

    def check_boot_memory(self) -> None:
        """Every node's unified-memory facts reported; a node under the floor refuses the boot."""
        if not self.plan.head.memory_facts:
            return
        floor = int(self["MEM_BOOT_FLOOR_GIB"])
        for node in self.plan.nodes:
            index = node.index
            facts = preflight.parse(self.nodes.output(index, node.memory_facts))
            where = self.nodes.label(index)
            if facts is None or facts.available_gib is None:
                raise Failed(f"cannot read MemAvailable on {where} (MEM_PREFLIGHT=1); set "
                             "MEM_PREFLIGHT=0 to boot without the memory preflight")
            say(f"memory on {where}: {preflight.describe(facts)}")
            if facts.available_gib >= floor:
                continue
            if self["FORCE_UNSAFE_BOOT_MEMORY"] == "1":
                warn(f"{where} has {facts.available_gib:.1f} GiB available, under "
                     f"MEM_BOOT_FLOOR_GIB={floor}; booting anyway (FORCE_UNSAFE_BOOT_MEMORY=1)")
                continue
            busy = preflight.others(facts)
            hint = f"stop {', '.join(busy)} or other memory users" if busy else "free memory"
            raise refusal("MEM_BOOT_FLOOR_GIB", str(floor),
                          f"{where} has only {facts.available_gib:.1f} GiB available before boot; "
                          f"{hint}, or set FORCE_UNSAFE_BOOT_MEMORY=1 (risk: the host swaps or "
                          "wedges while the weights load)")

    def readable(self, index: int, test: tuple[str, ...], path: str) -> bool:
        """TEST (`test -r PATH`) on node INDEX; on the head, where `test` is a shell builtin,
        asked here."""
        if index == 0:
            return os.access(path, os.R_OK)
        return self.nodes.run(index, test).returncode == 0

    def image_id_on(self, index: int, inspect: tuple[str, ...]) -> str:
        """The image ID INSPECT prints on node INDEX ("" when it is not there)."""
        found = self.nodes.output(index, inspect)
        return found if found and found.startswith("sha256:") else ""

    def check_base(self, building: bool) -> None:
        """BASE_IMAGE on the head against recipe.lock, before anything is built or started: a
        tag that now names another image than the lock's is refused; so is, under
        BASE_LOCK=strict, a vendor image the lock does not hold when the chain is to be built
        from it (refused before it is pulled)."""
        base, vendor = self["BASE_IMAGE"], self.checked.recipe.knobs["BASE_IMAGE"].default
        lock = read_base_lock(self.plan.base_lock)
        base_id = self.image_id_on(0, self.plan.base_image_id)
        if why := lock.moved(base, base_id, vendor):
            raise refusal("BASE_IMAGE", base, why)
        if building and base == vendor and (why := lock.unrecorded(base, base_id, self["BASE_LOCK"],
                                                                     vendor)):
            raise refusal("BASE_LOCK", self["BASE_LOCK"], why)

    def build_chain_on_head(self) -> None:
        """scripts/build.sh builds the chain (pulling the vendor image when missing, recording
        it in recipe.lock on first use); its refusal of the base is this run's, in its line."""
        image, base = self["IMAGE"], self["BASE_IMAGE"]
        chain = self.plan.chain_image
        if image != chain:
            raise refusal("IMAGE", image, f"not on the head, and scripts/build.sh builds {chain} "
                          f"only; accepted: an image present on the head, or {chain}")
        build = self.plan.build
        if not os.access(build[0], os.X_OK):
            raise Failed(f"{image} is missing and {build[0]} is not there to build it")
        say(f"{image} is not on the head: building the image chain from {base}")
        built = subprocess.run(list(build), check=False).returncode
        if built == baselock.BASE_REFUSED_EXIT:
            raise RefusedAbove()
        if built != 0:
            raise Failed("scripts/build.sh failed; nothing was started")

    def stream_image_to(self, index: int) -> None:
        """The head's image to worker INDEX: saved on the head, through the meter (told the
        image's size), loaded there."""
        image, node = self["IMAGE"], self.nodes.addresses[index]
        stream = self.plan.nodes[index].stream
        size = subprocess.run(list(stream.size), capture_output=True, text=True,
                              check=False).stdout.strip()
        say(f"streaming {image} to {self.nodes.label(index)} (docker save | ssh docker load)")
        save = subprocess.Popen(self.nodes.argv(0, stream.save), stdout=subprocess.PIPE)
        count = subprocess.Popen(self.nodes.argv(0, with_words(stream.meter, {IMAGE_BYTES: size})),
                                 stdin=save.stdout, stdout=subprocess.PIPE)
        load = subprocess.Popen(self.nodes.argv(index, stream.load), stdin=count.stdout,
                                stdout=subprocess.DEVNULL)
        save.stdout.close()
        count.stdout.close()
        if any(process.wait() != 0 for process in (load, count, save)):
            raise Failed(f"streaming {image} to {node} failed; nothing was started")

    def ensure_images(self) -> str:
        """IMAGE on every node with the head's ID, which it returns: built on the head when
        missing, streamed from the head to a worker that lacks it. The head's copy's labels
        are read once, before anything reaches a worker (check_image_base)."""
        image = self["IMAGE"]
        head_id = self.image_id_on(0, self.plan.head.image_id)
        self.check_base(building=not head_id)
        if not head_id:
            self.build_chain_on_head()
            head_id = self.image_id_on(0, self.plan.head.image_id)
            if not head_id:
                raise Failed(f"scripts/build.sh finished but {image} is still not on the head")
        self.check_image_base()
        self.parse_extra_args()
        for worker in self.plan.nodes[1:]:
            index, node = worker.index, worker.address
            found = self.image_id_on(index, worker.image_id)
            if not found:
                self.stream_image_to(index)
                found = self.image_id_on(index, worker.image_id)
                if not found:
                    raise Failed(f"{image} is still missing on {node} after streaming")
            if found != head_id:
                raise refusal("IMAGE", image, f"on {node} it is {found}, on the head {head_id}; "
                              f"accepted: one image ID on every node (docker rmi it on {node} "
                              "and rerun to stream the head's)")
        return head_id

    def check_image_base(self) -> None:
        """IMAGE's labels on the head: its base's vLLM release and the layers that base
        provides (for the start-up line); an EXTRA_ENV setting that release no longer honours
        is refused. An image without the labels is unknown: nothing refused."""
        self.base = image_base.parse(self.nodes.output(0, self.plan.image_labels))
        refused = image_base.retired_refusal(self["IMAGE"], self.base,
                                             self.checked.words["EXTRA_ENV"]) or \
            image_base.b12x_refusal(self["IMAGE"], self.base, self["MOE_BACKEND"],
                                    self["FORCE_UNSAFE_MOE"] == "1")
        if refused:
            raise refused

    def parse_extra_args(self) -> None:
        """EXTRA_ARGS parsed by the image's own vLLM parser on the head (a refusal when it
        rejects a flag; a note when the parse could not run)."""
        if not self.plan.extra_args_parse:
            return
        try:
            result = subprocess.run(list(self.plan.extra_args_parse), capture_output=True,
                                    text=True, timeout=extra_args.TIMEOUT_S, check=False)
        except (subprocess.TimeoutExpired, OSError) as error:
            say(extra_args.not_parsed(type(error).__name__))
            return
        extra_args.judge(result.stdout, self["IMAGE"], self["EXTRA_ARGS"], say)

    def prepare_jit_cache(self) -> None:
        """This image's JIT cache directory on every node; stop.sh leaves it, so the next
        boot of the same image skips the kernel builds."""
        if not self.plan.head.make_jit_cache:
            return
        folder = self.plan.launch.jit_dir
        for node in self.plan.nodes:
            if self.nodes.run(node.index, node.make_jit_cache).returncode != 0:
                raise Failed(f"cannot create the JIT cache {folder} on {node.address}")
        say(f"JIT cache: {folder} on every node")

    def scan_checkpoint(self) -> None:
        """The local MODEL scanned in the serving image on the head; its summary printed, and
        gate/up scales this image does not correct refused (CHECKPOINT_SCAN=warn: said
        loudly; a scan that cannot run is treated the same way)."""
        if not self.plan.scan_checkpoint:
            return
        model, image = self["MODEL"], self["IMAGE"]
        say(f"scanning {model} in {image} (config, safetensors headers, the experts' global "
            "scales; no weights)")
        # stderr kept: its last line is the scan's reason when it cannot read the directory
        scanned = subprocess.run(self.nodes.argv(0, self.plan.scan_checkpoint), text=True,
                                 stdin=subprocess.DEVNULL, capture_output=True, check=False)
        judge_scan(self.plan, scanned, f"in {image}",
                   lambda summary: say(f"checkpoint {model}: {summary}"))

    def resolve_and_record(self, repo: str, look_up: tuple[str, ...]) -> str:
        """REPO's current commit, asked of the Hub by LOOK_UP (in the serving image on the
        head), and recorded in PINS_FILE."""
        asked = self.nodes.run(0, look_up, capture=True)
        if asked.returncode != 0:
            raise Failed(f"could not resolve the revision of {repo} (is the Hub reachable and "
                         "HF_TOKEN_FILE set for gated repos?)")
        commit = asked.stdout.rstrip("\n").rsplit("\n", 1)[-1]
        if not pins.HEX40.fullmatch(commit):
            raise Failed(f"resolving {repo} gave '{commit}', not a 40-hex commit")
        known = self.checked.recipe.checkpoints.get(repo)
        if known and repo == self["MODEL"]:  # checked before it is recorded: a rerun asks again
            pins.require_known(repo, commit, known.revision_prefix, "the Hub resolves it to",
                               "MODEL_REVISION=<a commit starting with "
                               f"{known.revision_prefix}>")
        pins_file = Path(self["PINS_FILE"])
        pins_file.parent.mkdir(parents=True, exist_ok=True)
        with pins_file.open("a") as handle:
            handle.write(pins.line(repo, commit))
        say(f"pinned {repo} at {commit} (recorded in {self['PINS_FILE']}; delete the line to "
            "re-resolve)")
        return commit

    def prepare_drafter_everywhere(self) -> str:
        """Fetches the pinned drafter on every node and derives the directory vLLM loads; the
        head's prepare-drafter summary gives the start-up phrase (licence, window)."""
        launch, drafter = self.plan.launch, self.checked.drafter
        phrase = drafter.phrase
        if not launch.dflash2:
            return phrase
        for node in self.plan.nodes:
            index, where = node.index, self.nodes.label(node.index)
            if node.fetch_drafter:
                say(f"fetching {drafter.repo_id}@{launch.drafter_pin} on {where}")
                fetched = self.nodes.run(index, node.fetch_drafter, capture=True)
                if fetched.returncode != 0:
                    raise Failed(f"fetching {drafter.repo_id}@{launch.drafter_pin} failed on "
                                 f"{where}")
            say(f"preparing the drafter on {where}")
            prepared = self.nodes.run(index, node.prepare_drafter, capture=True)
            if prepared.returncode != 0:
                raise Failed(f"prepare-drafter refused {launch.draft_snapshot} on {where}")
            if index == 0:
                try:
                    phrase = json.loads(prepared.stdout)["startup"]
                except (ValueError, KeyError, TypeError):
                    raise Failed("prepare-drafter printed no start-up phrase: "
                                 f"{prepared.stdout.strip()}") from None
        return phrase

    # ------------------------------------------------------------------ host levers

    def lock_clocks(self) -> None:
        """GPU_CLOCK_MHZ on every node, each recorded before it is asked (host_levers.py)."""
        if not self.plan.head.lock_clocks:
            return
        self.clocks_locked = True
        host_levers.lock(self.nodes, self["RUNS_DIR"], self["IMAGE"],
                         self.checked.words["DOCKER_ARGS"], self.plan.clock_range,
                         [node.lock_clocks for node in self.plan.nodes], say)

    def probe_line(self, index: int) -> tuple[dict, str]:
        doc = probe_nodes.run_probe(self.nodes, index, self.plan.nodes[index].probe,
                                    f"a container of {self['IMAGE']}")
        return doc, node_platform.describe(doc)

    def compact_memory(self) -> None:
        """COMPACT_MEMORY=1: every node's free memory compacted, the platform probe's read
        bandwidth and large-block share printed before and after; a compaction that cannot
        run stops the start."""
        if not self.plan.head.compact_memory:
            return
        for node in self.plan.nodes:
            index, where = node.index, self.nodes.label(node.index)
            before, line = self.probe_line(index)
            say(f"platform on {where} before compaction: {line}")
            done = subprocess.run(self.nodes.argv(index, node.compact_memory),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [
                    f"exit {done.returncode}"]
                raise Failed(f"memory compaction failed on {where} ({why[0]}); set "
                             "COMPACT_MEMORY=0 to start without it")
            after, line = self.probe_line(index)
            say(f"platform on {where} after compaction: {line}")
            say(f"memory compaction on {where}: {node_platform.change(before, after)}")

    # ------------------------------------------------------------------ the ranks

    def start_ranks(self) -> None:
        self.ranks_started = True
        for rank in self.plan.ranks:
            say(f"starting rank {rank.rank} on {self.nodes.label(rank.rank)}")
            argv = rank.docker_run
            if API_KEY_ENV_FILE in argv:  # the head's rank: docker reads the key
                with server_env_file(self.api_key) as env_file:  # file, then it is gone
                    started = self.nodes.run(rank.rank,
                                             with_words(argv, {API_KEY_ENV_FILE: env_file}),
                                             capture=True)
            else:
                started = self.nodes.run(rank.rank, argv, capture=True)
            if started.returncode != 0:
                raise Failed(f"docker run failed for rank {rank.rank} on {rank.node}")

    def start_memory_guard(self) -> None:
        if not self.plan.head.memory_sampler:
            return
        runs = Path(self["RUNS_DIR"])
        run_dir = runs / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        if run_dir.exists():
            run_dir = run_dir.with_name(f"{run_dir.name}-{os.getpid()}")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            raise Failed(f"cannot create {run_dir} for the memory samples (RUNS_DIR)") from None
        self.run_dir = run_dir
        csv_path = run_dir / "memory.csv"
        self.guard = memguard.MemoryGuard(self.nodes, self.checked, csv_path)
        self.guard.start([node.memory_sampler for node in self.plan.nodes])
        floors = " / ".join(f"{phase} {self[knob]}" for phase, knob in zip(PHASES, FLOOR_KNOBS))
        say(f"memory guard: MemAvailable every {interval(self['MEM_SAMPLES_PER_SECOND'])} "
            f"s on {' '.join(self.nodes.addresses)}, floors {floors} GiB; samples in {csv_path}")

    def stop_memory_guard(self) -> None:
        if self.guard is not None:
            self.guard.stop()
            self.guard = None

    def rank_status(self, index: int) -> str:
        return self.nodes.output(index, self.plan.nodes[index].rank_status) or "missing"

    def report_dead_rank(self, index: int, status: str) -> None:
        planned = self.plan.nodes[index]
        container, node = planned.rank.container, planned.address
        warn(f"last {LOG_TAIL_LINES} log lines of {container} on {node}:")
        subprocess.run(self.nodes.argv(index, planned.rank_log_tail),
                       stdout=sys.stderr, stderr=sys.stderr, stdin=subprocess.DEVNULL, check=False)
        self.stop_memory_guard()
        stop_all_ranks(self.nodes, self.plan.removals)
        self.ranks_started = False
        raise Failed(f"rank {index} ({container} on {node}) is {status} before the API answered; "
                     "every rank was stopped")

    def guard_fired(self) -> None:
        """Kills every rank's container (kept, so `docker logs` still shows it), copies each
        rank's log beside the samples, and ends the run with the guard's reason."""
        reason = self.guard.reason
        for node in self.plan.nodes:
            if self.nodes.run(node.index, node.kill_rank, capture=True,
                              quiet=True).returncode != 0:
                warn(f"could not kill {node.rank.container} on {node.address}")
        for node in self.plan.nodes:
            with (self.run_dir / f"{node.rank.container}.log").open("w") as log:
                subprocess.run(self.nodes.argv(node.index, node.rank_log), stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
        self.stop_memory_guard()
        # The containers stay for their logs; the next run.sh removes them.
        self.ranks_started = False
        raise Failed(f"memory guard: {reason}; every rank was stopped (containers kept for docker "
                     f"logs; logs and samples in {self.run_dir})")

    def pause(self, seconds: float) -> None:
        """Sleeps SECONDS, woken at once when the memory guard fires."""
        if self.guard is None:
            time.sleep(seconds)
        elif self.guard.fired.wait(seconds):
            self.guard_fired()

    def wait_until_ready(self) -> None:
        """Polls the API while every rank's container is watched; a dead rank stops all."""
        start, last_report = time.monotonic(), -PROGRESS_EVERY_SECONDS
        port, count, check = self["PORT"], len(self.nodes.addresses), self["READY_CHECK"]
        # /health must answer twice in a row: an engine dying as the API comes up answers once.
        needed, healthy = (2 if check == "health" else 1), 0
        while True:
            self.pause(0)
            for index in range(count):
                status = self.rank_status(index)
                if status != "running":
                    self.report_dead_rank(index, status)
            probe = self.plan.ready_probe
            config = curl_config(self.api_key) if "--config" in probe else None
            answered = subprocess.run(list(probe), input=config, text=True,
                                      check=False).returncode == 0
            healthy = healthy + 1 if answered else 0
            if healthy >= needed:
                self.ready = True
                say(f"ready: http://{self.nodes.addresses[0]}:{port}/v1 after "
                    f"{int(time.monotonic() - start)} s; ./stop.sh stops every rank")
                return
            elapsed = int(time.monotonic() - start)
            if elapsed >= int(self["READY_TIMEOUT"]):
                self.stop_memory_guard()
                stop_all_ranks(self.nodes, self.plan.removals)
                self.ranks_started = False
                if check == "health":
                    raise Failed(f"/health did not answer 200 twice in a row within READY_TIMEOUT="
                                 f"{self['READY_TIMEOUT']} s; every rank was stopped")
                raise Failed(f"the API did not answer within READY_TIMEOUT={self['READY_TIMEOUT']} "
                             "s; every rank was stopped")
            if elapsed - last_report >= PROGRESS_EVERY_SECONDS:
                say(f"waiting for http://127.0.0.1:{port}{self.plan.ready_path}: {elapsed} s, all "
                    f"{count} ranks running")
                last_report = elapsed
            self.pause(int(self["POLL_SECONDS"]))
