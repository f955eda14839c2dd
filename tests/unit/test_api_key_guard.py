"""patches/v8/api_key_guard.py on its own (the helper v8_api_key installs beside vLLM's
AuthenticationMiddleware): a middleware of vLLM's shape, decorated, in front of a small
Starlette app with CORS inside it, as vLLM stacks them. Every path but /health needs the key;
a CORS preflight alone passes without it, and CORS answers it; the app's own routes answer once
the key is given. Undecorated, the same middleware lets /invocations through without the key:
what the checks here would catch."""

from __future__ import annotations

import importlib.util
import secrets

import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from recipekit.layers.v8_api_key import HELPER_SOURCE

KEY = "the-key"
PREFLIGHT = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}


def load_helper():
    spec = importlib.util.spec_from_file_location("glm53_api_key", HELPER_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guard = load_helper()


class PrefixOnly:
    """vLLM's middleware in miniature: the key on /v1 paths alone, OPTIONS never."""

    def __init__(self, app, tokens):
        self.app, self.tokens = app, tokens

    def verify_token(self, headers: Headers) -> bool:
        return any(secrets.compare_digest(headers.get("Authorization", ""), f"Bearer {token}")
                   for token in self.tokens)

    def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path.startswith("/v1") and not self.verify_token(Headers(scope=scope)):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
        return self.app(scope, receive, send)


class Guarded(PrefixOnly):
    __call__ = guard.guard_every_route(PrefixOnly.__call__)


async def answer(request):
    return PlainTextResponse("ran")


async def socket(websocket):
    await websocket.accept()
    await websocket.send_text("ran")
    await websocket.close()


def client(middleware_class, root_path: str = "") -> TestClient:
    app = Starlette(routes=[
        Route("/health", answer), Route("/v1/models", answer),
        Route("/invocations", answer, methods=["POST"]),
        Route("/generative_scoring", answer, methods=["POST"]),
        Mount("/metrics", app=PlainTextResponse("counters")),
        WebSocketRoute("/v1/realtime", socket),
    ], middleware=[Middleware(middleware_class, tokens=[KEY]),
                   Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"])])
    return TestClient(app, root_path=root_path)


KEYED = {"Authorization": f"Bearer {KEY}"}
ROUTES = [("GET", "/v1/models"), ("POST", "/invocations"), ("POST", "/generative_scoring"),
          ("GET", "/metrics/"), ("GET", "/no-such-route")]


@pytest.mark.parametrize("method, path", ROUTES)
def test_every_path_but_health_needs_the_key(method, path):
    guarded = client(Guarded)
    assert guarded.request(method, path).status_code == 401
    assert guarded.request(method, path, headers={"Authorization": "Bearer wrong"}
                           ).status_code == 401
    assert guarded.request(method, path, headers={"Authorization": KEY}).status_code == 401
    assert guarded.request(method, path, headers=KEYED).status_code != 401


def test_health_is_open_and_nothing_under_it():
    guarded = client(Guarded)
    assert guarded.get("/health").text == "ran"
    assert guarded.get("/health/").status_code == 401
    assert guarded.get("/healthz").status_code == 401


def test_the_undecorated_middleware_runs_the_model_routes_without_the_key():
    stock = client(PrefixOnly)
    assert stock.post("/invocations").text == "ran"
    assert stock.post("/generative_scoring").text == "ran"
    assert stock.get("/metrics/").text == "counters"


def test_a_preflight_passes_and_cors_answers_it_any_other_options_needs_the_key():
    guarded = client(Guarded)
    for path in ("/invocations", "/metrics/", "/v1/models"):
        reply = guarded.options(path, headers=PREFLIGHT)
        assert (reply.status_code, reply.text) == (200, "OK"), path
        assert guarded.options(path).status_code == 401, path
        assert guarded.options(path, headers={"Origin": "https://elsewhere.example"}
                               ).status_code == 401, path


def test_the_root_path_is_taken_off_as_vllm_does():
    guarded = client(Guarded, root_path="/api")
    assert guarded.get("/api/health").text == "ran"
    assert guarded.post("/api/invocations").status_code == 401


def test_a_websocket_is_denied_without_the_key_and_served_with_it():
    guarded = client(Guarded)
    with pytest.raises(WebSocketDisconnect) as denied:
        with guarded.websocket_connect("/v1/realtime"):
            pass
    assert denied.value.status_code == 401
    with guarded.websocket_connect("/v1/realtime", headers=KEYED) as connected:
        assert connected.receive_text() == "ran"


def test_the_wrapper_keeps_the_wrapped_call():
    assert Guarded.__call__.__wrapped__ is PrefixOnly.__call__
