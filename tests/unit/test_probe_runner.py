"""tests/vllm/probes/runner.py: each case, forked from the runner that imported what the
cases share, ends as the same script run alone in a fresh interpreter with the runner's
environment and the case's over it (output, exit status, path, __main__, traceback, what
the interpreter does at exit); a case's environment stays its own; a preload that imports
a module the cases must import themselves is refused."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.unit.test_launcher_support import REPO

RUNNER = REPO / "tests" / "vllm" / "probes" / "runner.py"

PROBE = """\
    import atexit, json, os, sys
    atexit.register(lambda: print("atexit ran"))
    kept = open(sys.argv[1], "w")
    kept.write("written at the interpreter's exit")  # never closed: the exit writes it
    print(json.dumps({"argv": sys.argv, "path": sys.path, "main": __name__, "file": __file__,
                      "switch": os.environ.get("GLM53_SWITCH"), "globals": sorted(globals()),
                      "loader": type(__loader__).__name__, "spec": __spec__,
                      "email_loaded": "email.mime.text" in sys.modules}))
    if os.environ.get("GLM53_FAIL"):
        def inner():
            raise KeyError("missing")
        inner()
    sys.exit(int(os.environ.get("GLM53_EXIT", "0")))
"""


def run_cases(tmp_path: Path, cases: list[dict], preload=("email.mime.text",), fresh=()):
    request, answer = tmp_path / "request.json", tmp_path / "answer.json"
    request.write_text(json.dumps({"preload": list(preload), "fresh": list(fresh),
                                   "cases": cases}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "tree")}
    result = subprocess.run([sys.executable, str(RUNNER), str(request), str(answer)],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    return result, (json.loads(answer.read_text()) if answer.is_file() else None)


def test_each_case_ends_as_the_script_alone_would(tmp_path):
    (tmp_path / "tree").mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    cases = [{"script": str(probe), "args": [str(tmp_path / f"kept-{name}.txt")], "env": env}
             for name, env in (("plain", {"GLM53_SWITCH": "on", "GLM53_EXIT": "3"}),
                               ("fails", {"GLM53_FAIL": "1"}), ("after", {}))]
    result, answers = run_cases(tmp_path, cases)
    assert result.returncode == 0, result.stderr
    for case, answer in zip(cases, answers, strict=True):
        alone = subprocess.run(
            [sys.executable, case["script"], *case["args"]], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(tmp_path / "tree"), **case["env"]},
            timeout=60, check=False)
        seen = json.loads(answer["stdout"].splitlines()[0])
        assert seen.pop("email_loaded") is True  # the preload is there, yet:
        assert json.loads(alone.stdout.splitlines()[0]).pop("email_loaded") is False
        assert answer["stdout"].splitlines()[1:] == alone.stdout.splitlines()[1:]
        assert seen == {k: v for k, v in json.loads(alone.stdout.splitlines()[0]).items()
                        if k != "email_loaded"}
        assert (answer["returncode"], answer["stderr"]) == (alone.returncode, alone.stderr)
        assert Path(case["args"][0]).read_text() == "written at the interpreter's exit"
    assert [a["returncode"] for a in answers] == [3, 1, 0]
    assert answers[1]["stderr"].startswith("Traceback (most recent call last):\n  File "
                                           f'"{probe}"')
    assert json.loads(answers[2]["stdout"].splitlines()[0])["switch"] is None


def test_a_preload_that_loads_a_fresh_module_is_refused(tmp_path):
    (tmp_path / "tree").mkdir()
    result, answers = run_cases(tmp_path, [], preload=("email.mime.text",), fresh=("email",))
    assert result.returncode == 2 and answers is None
    assert "the preload imported email, which each case must import" in result.stderr
