"""Run several probe scripts against one tree, each in a fork of one interpreter that has
imported what they share; each as if run alone with its own environment and arguments.

    python runner.py REQUEST.json ANSWER.json

REQUEST: {"preload": [modules], "fresh": [modules], "cases": [{"script": path,
"args": [...], "env": {NAME: value}}]}. The parent imports `preload`, then refuses (exit
2, one line on stderr) if any module of `fresh` is loaded: those read the environment at
import (layer v13's switches read GLM53_*), so each case's child must import them itself,
under its own environment. Each case then runs in its own fork: its env set, sys.argv
[script, *args], the script run as __main__; its stdout, stderr and exit code are written
to ANSWER as [{"returncode": int, "stdout": str, "stderr": str, "cpu_s": float}] in the cases' order (an
uncaught exception: its traceback on stderr and exit code 1, as the interpreter does).

Why: a probe's cost here is importing vLLM (15 to 25 s of CPU each on this machine); the
cases of one tree share all of it but the modules their environment changes.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# loaded by path, outside the tests' packages (it imports only the standard library), so
# nothing of the repository reaches the cases' process
_SERVER_FILE = Path(__file__).resolve().parents[2] / "prewarmed_server.py"
_spec = importlib.util.spec_from_file_location("_glm53_prewarmed_server", _SERVER_FILE)
prewarmed_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prewarmed_server)


def absolute_python_path(env: dict[str, str]) -> list[str]:
    """PYTHONPATH's folders as site.py leaves them in sys.path: absolute, without repeats."""
    value = env.get("PYTHONPATH", "")
    return list(dict.fromkeys(os.path.abspath(e) for e in value.split(os.pathsep))) if value else []


def base_path() -> list[str]:
    """This interpreter's path without its script's folder and PYTHONPATH: what every fresh
    interpreter of the venv has, which run_command puts a case's own folders into."""
    ours = set(absolute_python_path(dict(os.environ)))
    return [entry for entry in sys.path[1:] if entry not in ours]


def run_case(case: dict, out_path: str, err_path: str, base: list[str]) -> int:
    """In the child: the case as a command of tests/prewarmed_server.py, stdin this
    process's, stdout and stderr to the files."""
    env = {**os.environ, **case.get("env", {})}
    request = {"argv": [case["script"], *case.get("args", [])], "env": env,
               "cwd": os.getcwd(), "python_path": absolute_python_path(env)}
    fds = [os.dup(0), os.open(out_path, os.O_WRONLY | os.O_TRUNC),
           os.open(err_path, os.O_WRONLY | os.O_TRUNC)]
    return prewarmed_server.run_command(request, fds, base)


def main() -> None:
    request = json.loads(open(sys.argv[1]).read())
    for module in request.get("preload", []):
        importlib.import_module(module)
    loaded = sorted(m for m in request.get("fresh", []) if m in sys.modules)
    if loaded:
        print(f"runner: the preload imported {', '.join(loaded)}, which each case must import "
              "under its own environment", file=sys.stderr)
        sys.exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    base = base_path()
    gc.freeze()  # as the server does: a case's collection then copies none of the preload
    answers = []
    # not a TemporaryDirectory: its finalizer would sit in atexit, which each case runs
    tmp = tempfile.mkdtemp(prefix="probe-runner-")
    try:
        for index, case in enumerate(request["cases"]):
            out_path, err_path = (os.path.join(tmp, f"{index}.{n}") for n in ("out", "err"))
            for path in (out_path, err_path):
                open(path, "w").close()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run_case(case, out_path, err_path, base)
                finally:
                    os._exit(code)
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with open(out_path) as out, open(err_path) as err:
                answers.append({"returncode": code, "stdout": out.read(), "stderr": err.read(),
                                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(sys.argv[2], "w") as answer:
        json.dump(answers, answer)


if __name__ == "__main__":
    main()
