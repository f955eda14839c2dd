"""Fixtures of the engine tier: the engine venv, the tiny models, and a fleet of real vLLM
servers shared by the whole session.

The fleet starts every server the collected tests ask for (fixtures named `server_*`) at
once, on the first request for any of them, and stops them all at the end of the session.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine import engine_server, model_info, multibyte_models, tiny_models
from tests.engine.engine_env import EngineVenv, engine_venv
from tests.engine.engine_server import EngineServer, EngineSpec

# Engines run at the test's own priority. At nice 19 they yielded the CPU to the bench and
# the relay that time their streams, but beside a CPU hog at nice 0 they then got about 1%
# of it and never came up within the start timeout (seen: the bench tier's four engines
# silent for 8 min). The timing checks allow what the run's own wake-up delays measured
# (tests/timing.py), so a busy engine's effect on the readers is in their allowance.
ENGINE_NICENESS = 0
# drafts per step of the drafted servers
K = 4
TINY_CONTEXT = 4096
# what every tier server gets: a small context and KV pool, float32 (drafter and verifier
# agree exactly), eager (torch.compile costs 25-85 s a start here and the launcher test
# covers it), room for the bench's 4 streams plus warm-up, and 32-token blocks (the CPU
# kernel's smallest; the default 128 would leave a receipt's short turns without a full
# block to serve from the prefix cache), and the worker inside the engine core process
# (with engine_server.base_env's VLLM_ENABLE_V1_MULTIPROCESSING=0, without which vLLM's CPU
# platform replaces `uni` by `mp`)
TINY_SERVE_ARGS = ["--max-model-len", str(TINY_CONTEXT), "--dtype", "float32",
                   "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20),
                   "--max-num-seqs", "8", "--block-size", "32",
                   "--distributed-executor-backend", "uni"]


@dataclass(frozen=True)
class TinyModels:
    tokenizer: Path
    target: Path
    other: Path
    random_drafter: Path
    blind_drafter: Path
    blind_to: frozenset[int]
    multibyte_clean: Path         # answers the multibyte probe in Hangul, kana and emoji
    multibyte_corrupt: Path       # the same with a lone UTF-8 lead byte in every Korean cycle

    def oracle_drafter(self) -> Path:
        return tiny_models.oracle_drafter_dir()  # the target itself


def blind_token_set(vocab_size: int) -> tuple[int, ...]:
    """The blind drafter cannot name every third token id: it is wrong wherever the target's
    next token is one of them (about a third of positions in its varied output)."""
    return tuple(range(0, vocab_size, 3))


@pytest.fixture(scope="session", autouse=True)
def engine_tmpdir():
    """A temporary directory for everything this session starts, removed at its end.

    Every vLLM engine leaves files in the temporary directory it is given: the gloo store of
    its one-rank group (`vllm_dist_<uuid>`) and its ZeroMQ IPC sockets (`<uuid>`), about 200 a
    full run, never removed (seen: 1,700 sockets in /tmp after a day's runs). Children get
    TMPDIR; this process keeps the directory it had, so pytest's own tmp_path is unchanged.
    """
    tempfile.gettempdir()  # cached before TMPDIR changes: the worker's own stay where they were
    with (tempfile.TemporaryDirectory(prefix="glm53-engine-tier-", ignore_cleanup_errors=True)
          as path, pytest.MonkeyPatch.context() as patch):
        patch.setenv("TMPDIR", path)
        yield Path(path)


@pytest.fixture(scope="session")
def models() -> TinyModels:
    target = tiny_models.target_dir()
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    blind = blind_token_set(vocab_size)
    return TinyModels(tokenizer=tiny_models.tokenizer_dir(), target=target,
                      other=tiny_models.other_target_dir(),
                      random_drafter=tiny_models.random_drafter_dir(),
                      blind_drafter=tiny_models.blind_drafter_dir(blind),
                      blind_to=frozenset(blind),
                      multibyte_clean=multibyte_models.clean_target_dir(),
                      multibyte_corrupt=multibyte_models.corrupt_target_dir())


# every tiny model of the tier's servers is one (tiny_models.py, multibyte_models.py)
TINY_ARCHITECTURE = "Qwen3ForCausalLM"


@pytest.fixture(scope="session")
def engine() -> EngineVenv:
    venv = engine_venv()
    model_info.warm(venv, engine_server.base_env(venv), [TINY_ARCHITECTURE])
    return venv


def draft_model_args(drafter: Path, k: int = K) -> list[str]:
    return ["--speculative-config", json.dumps(
        {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": k})]


# the plain server's: the probes' tool calls go through vLLM's hermes parser (our template's
# tags); nothing else reads it
PLAIN_EXTRA = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def tiny_spec(model: Path, served: str, *extra: str) -> EngineSpec:
    """A tier server: MODEL served as SERVED with TINY_SERVE_ARGS, then EXTRA."""
    return EngineSpec(model, (*TINY_SERVE_ARGS, "--served-model-name", served, *extra))


def plain_spec(model: Path) -> EngineSpec:
    """MODEL served as the fleet's plain server serves the target."""
    return tiny_spec(model, "tiny-target", *PLAIN_EXTRA)


def server_specs(models: TinyModels) -> dict[str, EngineSpec]:
    """The fleet's servers by the names of their fixtures (`server_NAME`)."""
    return {
        "plain": plain_spec(models.target),
        "oracle": tiny_spec(models.target, "tiny-target",
                            *draft_model_args(models.oracle_drafter())),
        "blind": tiny_spec(models.target, "tiny-target", *draft_model_args(models.blind_drafter)),
        "other": tiny_spec(models.other, "tiny-other"),
        # the multibyte probe's truth: a clean and a corrupting target (multibyte_models.py)
        "multibyte_clean": tiny_spec(models.multibyte_clean, "tiny-multibyte-clean"),
        "multibyte_corrupt": tiny_spec(models.multibyte_corrupt, "tiny-multibyte-corrupt"),
    }


class Fleet:
    """The session's shared servers, one per EngineSpec: those the collected tests name
    (`server_NAME` fixtures) start together on first use; a spec asked for by `serve` starts
    then; `stop_all` stops every one. (EngineSpec lives in engine_server.py, not here: pytest
    imports this file as `conftest` and a test's `from tests.engine.conftest import` makes a
    second copy, whose classes are other classes, so its specs would never be equal.)"""

    def __init__(self, venv: EngineVenv, models: TinyModels, wanted: set[str], log_dir: Path):
        self.venv, self.log_dir = venv, log_dir
        self.specs = server_specs(models)
        self.wanted = {self.specs[name] for name in wanted if name in self.specs}
        self.servers: dict[EngineSpec, EngineServer] = {}
        self.ready: set[EngineSpec] = set()

    def _server(self, spec: EngineSpec, name: str) -> EngineServer:
        if spec not in self.servers:
            self.servers[spec] = spec.server(self.venv, name, self.log_dir,
                                             niceness=ENGINE_NICENESS).start()
        return self.servers[spec]

    def get(self, name: str) -> EngineServer:
        if name not in self.specs:
            raise ValueError(f"no server spec {name!r}; known: {sorted(self.specs)}")
        return self.serve(self.specs[name], name)

    def serve(self, spec: EngineSpec, name: str | None = None) -> EngineServer:
        """The running server of SPEC, started (with every wanted one) if none is."""
        names: dict[EngineSpec, str] = {}
        for known, known_spec in sorted(self.specs.items()):
            names.setdefault(known_spec, known)
        names.setdefault(spec, name or spec.model.name)
        for wanted in sorted(self.wanted | {spec}, key=names.__getitem__):
            self._server(wanted, names[wanted])
        server = self.servers[spec]
        if spec not in self.ready:
            try:
                server.wait_ready()
            except Exception:
                self.stop_all()
                raise
            self.ready.add(spec)
        return server

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()


# The files whose tests use the session's fleet: under xdist (scripts/test runs this tier
# on two workers with --dist loadfile) they run on one worker, so the fleet boots once. The
# controller schedules before any test is collected, so it reads this list; every worker
# checks it against the tests' fixtures.
FLEET_FILES = frozenset({"test_bench_engine.py", "test_launcher_engine.py", "test_models_engine.py",
                         "test_probes_engine.py", "test_quality_engine.py",
                         "test_receipts_engine.py", "test_turns_engine.py"})
ENGINE_TIER = Path(__file__).resolve().parent
FLEET_SCOPE = "fleet"
# What each unit of scheduling costs one worker, in seconds, as measured (docs/tests.md,
# "Where the engine tier's time goes"): the controller hands the units out longest first, so
# that no long one starts last beside an idle core. Only the order depends on these; a unit
# not listed counts as DEFAULT_COST_S.
SCOPE_COST_S = {FLEET_SCOPE: 600, "test_compare_engine.py": 440,
                "test_dflash2_sampling_engine.py": 400, "test_dflash2_engine.py": 295,
                "test_launcher_two_ranks.py": 270, "test_adaptive_verify_engine.py": 220,
                "test_health_engine.py": 70, "test_api_key_engine.py": 60}
DEFAULT_COST_S = 60


def scope_of(file: str) -> str:
    """The unit of scheduling of a test file (its path in a node id): the file, and the
    fleet's files one unit."""
    return FLEET_SCOPE if Path(file).name in FLEET_FILES else file


def scope_cost_s(scope: str) -> float:
    return SCOPE_COST_S.get(Path(scope).name, DEFAULT_COST_S)


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the fleet's files as one unit, the units in the collection's
    order (pytest_collection_modifyitems puts the costliest first), not xdist's by number of
    tests. (xdist's loadgroup would group by marker, but it renames node ids, which pytest 9
    no longer lets a plugin do.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FleetFileScheduling(LoadFileScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid.split("::", 1)[0])

    return FleetFileScheduling(config, log)


def pytest_collection_modifyitems(items):
    """Refuses a stale FLEET_FILES (a file must be listed exactly when a test of it uses the
    fleet), and orders this tier's tests by their unit's cost, costliest first (each file's
    tests, and the fleet's files, keep their order)."""
    ours = [item for item in items if ENGINE_TIER in item.path.parents]
    using = {item.path.name for item in ours if "fleet" in getattr(item, "fixturenames", ())}
    collected = {item.path.name for item in ours}
    stale = (using ^ FLEET_FILES) & collected
    if stale:
        raise pytest.UsageError(f"tests/engine/conftest.py: FLEET_FILES is wrong for "
                                f"{', '.join(sorted(stale))}: list exactly the files whose tests "
                                f"use the fleet")
    if len(ours) == len(items):
        items.sort(key=lambda item: -scope_cost_s(scope_of(item.nodeid.split("::", 1)[0])))


def pytest_collection_finish(session):
    """The servers the collected tests use: fixtures `server_NAME`, and `server` given NAME
    by indirect parametrisation."""
    wanted = set()
    for item in session.items:
        wanted |= {name.removeprefix("server_") for name in getattr(item, "fixturenames", ())
                   if name.startswith("server_")}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "server" in callspec.params:
            wanted.add(callspec.params["server"])
    session.config.stash[WANTED] = wanted


WANTED = pytest.StashKey[set]()


@pytest.fixture(scope="session")
def fleet(request, engine, models, tmp_path_factory):
    wanted = request.config.stash.get(WANTED, set())
    fleet = Fleet(engine, models, wanted, tmp_path_factory.mktemp("engine-logs"))
    yield fleet
    fleet.stop_all()


@pytest.fixture
def server(request, fleet) -> EngineServer:
    """The server named by indirect parametrisation: parametrize("server", [...], indirect=True)."""
    return fleet.get(request.param)


@pytest.fixture(scope="session")
def server_plain(fleet) -> EngineServer:
    return fleet.get("plain")


@pytest.fixture(scope="session")
def server_oracle(fleet) -> EngineServer:
    return fleet.get("oracle")


@pytest.fixture(scope="session")
def server_blind(fleet) -> EngineServer:
    return fleet.get("blind")


@pytest.fixture(scope="session")
def server_other(fleet) -> EngineServer:
    return fleet.get("other")


@pytest.fixture(scope="session")
def server_multibyte_clean(fleet) -> EngineServer:
    return fleet.get("multibyte_clean")


@pytest.fixture(scope="session")
def server_multibyte_corrupt(fleet) -> EngineServer:
    return fleet.get("multibyte_corrupt")


# Where the tier's time goes, per test file: its tests' setup, call and teardown summed, and
# how much of that its process spent waiting for engines to come up (EngineServer's waits,
# and the boots run.sh and scripts/compare report). Filled from every test's report, so under
# xdist the controller sees the workers' numbers.
BOOT_PROPERTY = "engine_ready_waits"
_FILE_SECONDS: dict[str, float] = {}
_FILE_WAITS: dict[str, list[tuple[str, float, float]]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if engine_server.READY_WAITS:
        report.user_properties.append((BOOT_PROPERTY, list(engine_server.READY_WAITS)))
        engine_server.READY_WAITS.clear()
    return report


def pytest_runtest_logreport(report):
    file = report.nodeid.split("::", 1)[0]
    if not file.startswith("tests/engine/"):
        return
    _FILE_SECONDS[file] = _FILE_SECONDS.get(file, 0.0) + report.duration
    for name, value in report.user_properties:
        if name == BOOT_PROPERTY:
            _FILE_WAITS.setdefault(file, []).extend(tuple(wait) for wait in value)


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    terminalreporter.section("engine boots per file")
    terminalreporter.write_line(f"{'file':34} {'tests s':>7} {'boots':>5} {'waiting s':>9} "
                                f"{'rest s':>7}  boots' start to ready, s")
    total = waited_total = 0.0
    for file, seconds in sorted(_FILE_SECONDS.items(), key=lambda entry: -entry[1]):
        waits = _FILE_WAITS.get(file, [])
        waited = sum(wait for _, wait, _ in waits)
        total, waited_total = total + seconds, waited_total + waited
        ready = " ".join(f"{name} {ready:.0f}" for name, _, ready in waits)
        terminalreporter.write_line(f"{Path(file).name:34} {seconds:7.0f} {len(waits):5d} "
                                    f"{waited:9.0f} {seconds - waited:7.0f}  {ready}")
    terminalreporter.write_line(f"{'all':34} {total:7.0f} {'':5} {waited_total:9.0f} "
                                f"{total - waited_total:7.0f}")
