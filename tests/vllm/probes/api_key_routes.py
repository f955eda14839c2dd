"""Run with PYTHONPATH=<a vLLM tree that v8_api_key patched> on CPU torch: vLLM's own FastAPI
app, built by the tree's build_app with the API key set and every optional router on (all
tasks, a stand-in model config for the pooling routers, VLLM_SERVER_DEV_MODE=1 and each
route-adding flag this tree's parser has), asked on every route it lists (starlette's
TestClient, no engine, no lifespan). Prints one JSON line:

    middleware  the module and class of the authentication middleware the app installed,
                and whether its __call__ is wrapped (the layer's decorator)
    routes      [path, kind, methods] of every route in app.routes, in order
    patched     {"METHOD path": {"none", "wrong", "key", "options", "preflight"}}: the status
                with no key, a wrong key, the key (HTTP only: a websocket route's handler
                would wait), a plain OPTIONS without a key, and a CORS preflight's status and
                body (CORSMiddleware answers it itself: "OK" or its "Disallowed CORS ...")
    stock       {"METHOD path": status with no key} with vLLM's own __call__ (the wrapper's
                __wrapped__): what the tree does without the layer
    options     every option string of this tree's `vllm serve` parser
    abbreviated {flag: whether `vllm serve` takes its shortest unique prefix as that flag}
                for --api-key and --hf-token: why EXTRA_ARGS refuses prefixes too

0.33.0 and 0.34.0 import orjson at module level for a JSON response path; the test venv
lacks it, so a stand-in backed by json is put in its place when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import types
import typing

KEY = "probe-key"
_HIDDEN = ("torchvision", "torchaudio", "torchcodec")  # as tests/vllm/test_launcher_vllm_args.py
_find_spec = importlib.util.find_spec
importlib.util.find_spec = (lambda name, package=None: None if name.split(".")[0] in _HIDDEN
                            else _find_spec(name, package))


class _Hide:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hide)
if _find_spec("orjson") is None:
    orjson = types.ModuleType("orjson")
    orjson.dumps = lambda obj, default=None, option=None: json.dumps(obj, default=default).encode()
    orjson.loads = json.loads
    orjson.JSONDecodeError = json.JSONDecodeError
    orjson.OPT_NON_STR_KEYS, orjson.OPT_SERIALIZE_NUMPY = 1, 2
    sys.modules["orjson"] = orjson
os.environ["VLLM_SERVER_DEV_MODE"] = "1"
os.environ.pop("VLLM_API_KEY", None)

import vllm.platforms  # noqa: E402
import vllm.tasks  # noqa: E402
from starlette.routing import Mount, WebSocketRoute  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

try:
    from vllm.entrypoints.launchers.app import build_app  # 0.30.0 on
except ImportError:
    from vllm.entrypoints.openai.api_server import build_app  # 0.27.1, the fork

# flags that add routers when set (each used where this tree's parser has it)
ROUTE_FLAGS = ("--enable-scale-out", "--enable-fault-tolerance",
               "--enable-tokenizer-info-endpoint", "--enable-server-load-tracking")
PREFLIGHT = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}


class StandInModelConfig:
    """What the routers read of a model config: a pooling model with a scoring head; any
    other attribute (a switch such as enable_sleep_mode) is on, so its routes are listed."""
    architecture = "StandIn"
    hf_config = types.SimpleNamespace(num_labels=1)
    io_processor_plugin = None

    def get_pooling_task(self, supported_tasks):
        return "embed"

    def __getattr__(self, name):
        return True


def serve_parser():
    parser = FlexibleArgumentParser(prog="vllm")
    return parser, ServeSubcommand().subparser_init(parser.add_subparsers())


def abbreviated(parser, options: list[str], flag: str) -> bool:
    """Whether FLAG's shortest prefix that no other option shares parses as FLAG."""
    others = [o for o in options if o != flag]
    for end in range(3, len(flag)):
        prefix = flag[:end]
        if not any(o.startswith(prefix) for o in others):
            break
    else:
        return False
    dest = flag.lstrip("-").replace("-", "_")
    try:
        parsed = parser.parse_args(["serve", "m", prefix, "probe-value"])
    except SystemExit:
        return False
    value = getattr(parsed, dest, None)
    return value == "probe-value" or value == ["probe-value"]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x", path)


def targets(app) -> list[tuple[str, str, str]]:
    """(kind, method, concrete path) of every route; a mount is asked at its path + "/"."""
    found = []
    for route in app.routes:
        if isinstance(route, Mount):
            found.append(("mount", "GET", concrete(route.path) + "/"))
        elif isinstance(route, WebSocketRoute) or type(route).__name__ == "APIWebSocketRoute":
            found.append(("websocket", "WS", concrete(route.path)))
        else:
            for method in sorted(route.methods or ()):
                if method != "HEAD":  # starlette answers HEAD through GET
                    found.append(("http", method, concrete(route.path)))
    return found


def ask(client, kind: str, method: str, path: str, headers: dict) -> int:
    if kind == "websocket":
        try:
            with client.websocket_connect(path, headers=headers):
                return 101
        except WebSocketDisconnect as closed:  # a denial response carries its HTTP status
            return getattr(closed, "status_code", None) or 1000 + closed.code
    body = {} if method in ("POST", "PUT", "PATCH") else None
    return client.request(method, path, headers=headers, json=body).status_code


def main() -> None:
    parser, serve = serve_parser()
    options = sorted({o for action in serve._actions for o in action.option_strings})
    args = parser.parse_args(["serve", "placeholder/model", "--api-key", KEY,
                              *[flag for flag in ROUTE_FLAGS if flag in options]])
    tasks = typing.get_args(vllm.tasks.SupportedTask)
    app = build_app(args, tasks, StandInModelConfig())
    middleware = next(m.cls for m in app.user_middleware
                      if m.cls.__name__ == "AuthenticationMiddleware")
    call = middleware.__dict__["__call__"]
    client = TestClient(app, raise_server_exceptions=False)
    keyed, wrong = {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer not-the-key"}
    patched, stock = {}, {}
    for kind, method, path in targets(app):
        name = f"{method} {path}"
        answers = {"none": ask(client, kind, method, path, {}),
                   "wrong": ask(client, kind, method, path, wrong)}
        if kind != "websocket":
            answers["key"] = ask(client, kind, method, path, keyed)
            answers["options"] = client.options(path).status_code
            reply = client.options(path, headers=PREFLIGHT)
            answers["preflight"] = [reply.status_code, reply.text[:60]]
        patched[name] = answers
    if hasattr(call, "__wrapped__"):
        middleware.__call__ = call.__wrapped__  # vLLM's own check alone
        for kind, method, path in targets(app):
            stock[f"{method} {path}"] = ask(client, kind, method, path, {})
        middleware.__call__ = call
    print(json.dumps({
        "middleware": {"module": middleware.__module__, "class": middleware.__name__,
                       "wrapped": hasattr(call, "__wrapped__")},
        "routes": [[getattr(r, "path", ""), type(r).__name__, sorted(getattr(r, "methods", None)
                                                                     or ())] for r in app.routes],
        "patched": patched, "stock": stock, "options": options,
        "abbreviated": {flag: abbreviated(parser, options, flag)
                        for flag in ("--api-key", "--hf-token") if flag in options},
    }))


if __name__ == "__main__":
    main()
