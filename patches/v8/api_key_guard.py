"""Every route needs the API key but /health (installed by the chain's v8 image beside vLLM's
AuthenticationMiddleware as ``glm53_api_key.py``; recipekit/layers/v8_api_key.py).

vLLM's AuthenticationMiddleware asks for the key only on paths starting with its
``GUARDED_PREFIX`` (/v1, /v2, /inference, /cohere), so ``POST /invocations`` (SageMaker's
route: chat and completions), ``POST /generative_scoring`` (a prefill with logprobs), the
pooling routes (/pooling, /classify, /score, /rerank) and the development routes answer
without it. ``guard_every_route`` decorates the middleware's ``__call__``: the key is asked
for on every path except ``OPEN_PATHS``, so a route vLLM adds later is guarded too, and vLLM's
own check still runs after it. Only a CORS preflight (OPTIONS with Origin and
Access-Control-Request-Method) passes without the key: vLLM's CORSMiddleware, installed just
inside this one, answers it itself, and a browser sends no credentials on a preflight.

Why /health alone is open (docs/security.md): the launcher's readiness wait and doctor,
Docker health checks and load balancers poll it; it answers 200 or 503 and runs no model.
/metrics (other users' request and token counts, latencies, prefix-cache hits), /version,
/tokenize and /detokenize (the chat template on any input), /ping and the API docs need the
key like the rest; every client of this recipe sends it on every request.
"""

from __future__ import annotations

import functools

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

OPEN_PATHS = frozenset({"/health"})
_PREFLIGHT_HEADERS = ("origin", "access-control-request-method")


def is_open(scope) -> bool:
    """Whether SCOPE's request may pass without the key: an open path, a CORS preflight, or
    no HTTP request at all (lifespan)."""
    if scope["type"] not in ("http", "websocket"):
        return True
    root_path = scope.get("root_path", "")
    if scope["path"].removeprefix(root_path) in OPEN_PATHS:
        return True
    if scope.get("method") == "OPTIONS":
        headers = Headers(scope=scope)
        return all(name in headers for name in _PREFLIGHT_HEADERS)
    return False


def guard_every_route(call):
    """AuthenticationMiddleware.__call__, answering 401 before vLLM's own check on any path
    outside OPEN_PATHS whose request lacks the key (the middleware's own verify_token)."""

    @functools.wraps(call)
    def guarded(self, scope, receive, send):
        if not is_open(scope) and not self.verify_token(Headers(scope=scope)):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return call(self, scope, receive, send)

    return guarded
