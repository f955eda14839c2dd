"""The API key on every pinned tree (issue 46): v8_api_key makes every route of vLLM's own app
need the key but /health, and no flag of vLLM's parser that carries a credential passes
EXTRA_ARGS.

Each tree is patched by v8_api_key and its own FastAPI app is built on CPU
(tests/vllm/probes/api_key_routes.py: every router on, the key set); the routes are the ones
app.routes lists, asked without the key, with a wrong one and with the key. The same app with
vLLM's own __call__ (the decorator's __wrapped__) shows what the trees do without the layer:
/invocations and /generative_scoring run without the key. The probe also lists each tree's
`vllm serve` options, against which launcher/plan/checks.py's SECRET_FLAGS is held.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from launcher.plan import apikey, checks
from recipekit.layers import load_layer, run_layer
from recipekit.layers.v8_api_key import HELPER_SOURCE, helper_of, middleware_files, open_paths
from recipekit.tree import TreeView
from tests.unit.test_launcher_refusals import core_refusal
from tests.vllm.conftest import REPO_ROOT, answered_by, run_python

TREES = ("fork", "0.27.1", "0.30.0", "0.33.0", "0.34.0")
# what the probe runs of vLLM (the app, its middleware, `vllm serve`'s options): a tree
# identical here to an earlier one is answered by its probe
PROBED_PACKAGES = ("vllm/entrypoints", "vllm/engine", "vllm/config")
PROBE = REPO_ROOT / "tests/vllm/probes/api_key_routes.py"
# The routes that run the model without the key on stock trees (issue 46's finding).
MODEL_ROUTES = ("POST /invocations", "POST /generative_scoring")
# A flag name that suggests a credential.
SECRET_WORDS = re.compile(r"key|token|secret|passw|credential|auth", re.IGNORECASE)
# Flags with such a name whose value is not a credential, and why.
NOT_SECRET = {
    "--ssl-keyfile": "a path to the TLS key file, not the key",
    "--allow-credentials": "a CORS switch (Access-Control-Allow-Credentials)",
    "--tokenizer": "a tokenizer name or path",
    "--tokenizer-mode": "a tokenizer mode",
    "--tokenizer-revision": "a revision of the tokenizer's repository",
    "--skip-tokenizer-init": "a switch",
    "--enable-tokenizer-info-endpoint": "a switch",
    "--disable-tokenizer-info-endpoint": "a switch",
    "--enable-prompt-tokens-details": "a switch",
    "--disable-prompt-tokens-details": "a switch",
    "--return-tokens-as-token-ids": "a switch",
    "--tokens-only": "a switch",
    "--spec-tokens": "a count",
    "--max-num-batched-tokens": "a count",
    "--max-num-scheduled-tokens": "a count",
    "--max-num-queued-tokens": "a count",
    "--long-prefill-token-threshold": "a count",
    "--long-prefill-token-threshold-adaptive": "a switch",
    "--dbo-decode-token-threshold": "a count",
    "--dbo-prefill-token-threshold": "a count",
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory, release):
    """{tree: (patched root, the probe's JSON)}: each distinct tree patched, then probed, all
    at once; a tree answered by another's probe (conftest.answered_by) gets that one's."""
    answering = answered_by(TREES, PROBED_PACKAGES, release)
    # the probes run side by side, each forked from the prewarmed interpreter
    with ThreadPoolExecutor() as probes:
        runs = {}
        for version in dict.fromkeys(answering.values()):  # each answering tree once, in order
            root = tmp_path_factory.mktemp(f"keys-{version}")
            shutil.copytree(release(version), root, dirs_exist_ok=True, copy_function=os.link)
            result = run_layer(load_layer("v8_api_key"), root, import_check="off")
            assert result.outcome == "applied", (version, result)
            runs[version] = (root, probes.submit(
                run_python, [sys.executable, str(PROBE)], cwd=root, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(root)}, timeout=900))
        out = {}
        for version, (root, run) in runs.items():
            result = run.result()
            assert result.returncode == 0, (version, result.stderr[-3000:])
            out[version] = (root, json.loads(result.stdout.strip().splitlines()[-1]))
    return {tree: out[answering[tree]] for tree in TREES}


def test_the_open_list_is_health_alone_and_the_launcher_knows_it():
    assert open_paths() == frozenset({"/health"})
    assert frozenset(apikey.OPEN_PATHS) == open_paths()


@pytest.mark.parametrize("version", TREES)
def test_every_listed_route_but_health_needs_the_key(probed, version):
    root, doc = probed[version]
    answers = doc["patched"]
    assert set(MODEL_ROUTES) <= set(answers)  # the app's own list holds them
    assert len(answers) >= 40, sorted(answers)
    for route, answer in answers.items():
        path = route.split(" ", 1)[1]
        if path in open_paths():
            assert answer["none"] != 401, (route, answer)
            continue
        assert answer["none"] == answer["wrong"] == 401, (route, answer)
        if "key" in answer:  # HTTP routes: the key passes (the handler then lacks an engine)
            assert answer["key"] != 401, (route, answer)


@pytest.mark.parametrize("version", TREES)
def test_only_a_cors_preflight_passes_without_the_key_and_cors_answers_it(probed, version):
    _, doc = probed[version]
    for route, answer in doc["patched"].items():
        if "preflight" not in answer:
            continue
        # CORSMiddleware's own answers (0.33.0 on allow no origin by default), never a handler's
        assert answer["preflight"] in ([200, "OK"], [400, "Disallowed CORS origin"]), \
            (route, answer)
        if route.split(" ", 1)[1] not in open_paths():
            assert answer["options"] == 401, (route, answer)


@pytest.mark.parametrize("version", TREES)
def test_stock_vllm_runs_the_model_routes_without_the_key(probed, version):
    """What the layer fixes, and what a test without it would have caught."""
    _, doc = probed[version]
    for route in MODEL_ROUTES:
        assert doc["stock"][route] != 401, (route, doc["stock"][route])
    open_in_stock = {route for route, status in doc["stock"].items() if status != 401}
    assert {"GET /metrics", "POST /tokenize"} <= open_in_stock


@pytest.mark.parametrize("version", TREES)
def test_the_app_s_middleware_is_the_one_the_layer_patched(probed, version):
    root, doc = probed[version]
    found = doc["middleware"]
    assert found["wrapped"], found
    target, = middleware_files(TreeView(root))
    assert found["module"] == target[:-3].replace("/", ".")
    assert (root / helper_of(target)).read_bytes() == HELPER_SOURCE.read_bytes()


@pytest.mark.parametrize("version", TREES)
def test_a_second_run_finds_it_already_applied(probed, version):
    root, _ = probed[version]
    assert run_layer(load_layer("v8_api_key"), root, import_check="off").outcome == \
        "already-applied"


def test_a_base_that_guards_every_route_provides_it(tree_copy):
    root = tree_copy("0.30.0")
    path = root / "vllm/entrypoints/serve/middleware/authenticate.py"
    text = path.read_text()
    gate = "url_path.startswith(GUARDED_PREFIX) and "
    assert text.count(gate) == 1
    path.unlink()  # a hard link into the cache: replaced, never written through
    path.write_text(text.replace(gate, ""))
    result = run_layer(load_layer("v8_api_key"), root, import_check="off")
    assert result.outcome == "provided-by-base", result


@pytest.mark.parametrize("change, reason", [
    (("self.verify_token(headers)", "True"), "no longer calls verify_token"),
    (("class AuthenticationMiddleware:", "class AuthenticationMiddlewareV2:"), "0 modules"),
])
def test_a_drifted_base_is_refused(tree_copy, change, reason):
    root = tree_copy("0.30.0")
    path = root / "vllm/entrypoints/serve/middleware/authenticate.py"
    text = path.read_text()
    assert text.count(change[0]) == 1
    path.unlink()
    path.write_text(text.replace(*change))
    result = run_layer(load_layer("v8_api_key"), root, import_check="off")
    assert result.outcome == "refused" and reason in result.reason, result


def test_a_second_middleware_is_refused_as_ambiguous(tree_copy):
    root = tree_copy("0.30.0")
    source = root / "vllm/entrypoints/serve/middleware/authenticate.py"
    shutil.copy(source, source.with_name("authenticate_copy.py"))
    result = run_layer(load_layer("v8_api_key"), root, import_check="off")
    assert result.outcome == "refused" and "2 modules" in result.reason, result


# ----------------------------------------------------------------- EXTRA_ARGS and the parser


def secret_looking(options: list[str]) -> set[str]:
    return {option for option in options if option.startswith("--")
            and not option.startswith("--no-") and SECRET_WORDS.search(option)}


@pytest.mark.parametrize("version", TREES)
def test_every_flag_that_looks_secret_is_classified(probed, version):
    """A new flag whose name suggests a credential fails here until SECRET_FLAGS refuses it
    or NOT_SECRET says why it carries none."""
    _, doc = probed[version]
    unclassified = secret_looking(doc["options"]) - set(checks.SECRET_FLAGS) - set(NOT_SECRET)
    assert unclassified == set()


def test_the_tables_name_only_real_flags(probed):
    options = set().union(*(doc["options"] for _, doc in probed.values()))
    assert set(checks.SECRET_FLAGS) <= options
    assert set(NOT_SECRET) <= options
    assert not set(checks.SECRET_FLAGS) & set(NOT_SECRET)


@pytest.mark.parametrize("version", TREES)
def test_vllm_takes_a_secret_flag_by_its_prefix(probed, version):
    """Why EXTRA_ARGS refuses a prefix too: each tree's parser reads `--api-k S` as --api-key."""
    _, doc = probed[version]
    assert doc["abbreviated"] == {flag: True for flag in checks.SECRET_FLAGS}


@pytest.mark.parametrize("flag", sorted(checks.SECRET_FLAGS))
def test_extra_args_refuses_each_secret_flag_in_every_form(tmp_path, flag):
    setting = checks.SECRET_FLAGS[flag][0]
    for words in (f"{flag} s3cret", f"{flag}=s3cret", f"{flag[:-2]} s3cret",
                  f"--served-model-name glm {flag} s3cret"):
        line = core_refusal(tmp_path, EXTRA_ARGS=words)
        assert line is not None and line.startswith("refused: EXTRA_ARGS=") and setting in line, \
            (words, line)
        assert "s3cret" not in line, line


def test_extra_args_takes_flags_that_only_look_secret(tmp_path):
    assert core_refusal(tmp_path, EXTRA_ARGS="--tokenizer-mode auto --ssl-keyfile "
                        "/etc/ssl/key.pem") is None
