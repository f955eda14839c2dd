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

import importlib
import json
import os
import runpy
import sys
import tempfile
import traceback


def run_case(case: dict, out_path: str, err_path: str) -> int:
    """In the child: fds 1 and 2 to files, the case's env and argv, the script as __main__."""
    for fd, path in ((1, out_path), (2, err_path)):
        file = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(case.get("env", {}))
    sys.argv = [case["script"], *case.get("args", [])]
    sys.path[0] = os.path.dirname(os.path.abspath(case["script"]))
    code = 0
    try:
        runpy.run_path(case["script"], run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


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
    answers = []
    with tempfile.TemporaryDirectory(prefix="probe-runner-") as tmp:
        for index, case in enumerate(request["cases"]):
            out_path, err_path = (os.path.join(tmp, f"{index}.{n}") for n in ("out", "err"))
            for path in (out_path, err_path):
                open(path, "w").close()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run_case(case, out_path, err_path)
                finally:
                    os._exit(code)
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with open(out_path) as out, open(err_path) as err:
                answers.append({"returncode": code, "stdout": out.read(), "stderr": err.read(),
                                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)})
    with open(sys.argv[2], "w") as answer:
        json.dump(answers, answer)


if __name__ == "__main__":
    main()
