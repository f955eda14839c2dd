"""tests/prewarmed.py: a command forked from the prewarmed interpreter ends as the same
command in a fresh interpreter does (exit status, output, working directory, path, stdin,
tracebacks, atexit and threads at exit), and any command that might not goes to a fresh one."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from tests.prewarmed import Prewarmed, PrewarmedError

PRELOAD = ("email.mime.text", "xml.dom.minidom")


@pytest.fixture(scope="module")
def server():
    warm = Prewarmed(PRELOAD)
    yield warm
    warm.close()


def both(server, args, **options):
    """(forked, fresh) results of one command; asserts it went to the fork."""
    forked_before = server.forked
    forked = server.run(args, **options)
    assert server.forked == forked_before + 1, dict(server.fresh)
    return forked, subprocess.run(args, **options)


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_script_sees_its_argv_folder_path_and_environment_as_it_would_alone(server, tmp_path):
    probe = script(tmp_path, "probe.py", """\
        import json, os, sys
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path": sys.path,
                          "switch": os.environ.get("GLM53_SWITCH"), "main": __name__,
                          "file": __file__, "globals": sorted(globals()),
                          "loader": type(__loader__).__name__, "spec": __spec__,
                          "cached": __cached__, "package": __package__,
                          "is_main": sys.modules["__main__"].__dict__ is globals()}))
        print("to stderr", file=sys.stderr)
        sys.exit(7)
    """)
    extra = tmp_path / "extra"
    extra.mkdir()
    options = dict(capture_output=True, text=True, cwd=tmp_path, timeout=60,
                   env={**os.environ, "PYTHONPATH": f"{extra}{os.pathsep}{extra}",
                        "GLM53_SWITCH": "on"})
    forked, fresh = both(server, [sys.executable, probe, "a b", "c"], **options)
    assert forked.returncode == fresh.returncode == 7
    assert forked.stdout == fresh.stdout and forked.stderr == fresh.stderr == "to stderr\n"
    path = json.loads(forked.stdout)["path"]
    assert path[0] == str(tmp_path) and path.count(str(extra)) == 1


def test_dash_c_reads_stdin_and_bytes_come_back_as_bytes(server, tmp_path):
    code = ("import sys; data = sys.stdin.read(); print(len(data), data[-5:].upper(), sys.argv,"
            "sorted(globals()), __loader__.__name__, __spec__)")
    forked, fresh = both(server, [sys.executable, "-c", code, "x"], input=b"hello" * 50_000,
                         capture_output=True, cwd=tmp_path, timeout=60)
    assert forked.stdout == fresh.stdout
    assert forked.stdout.startswith(b"250000 HELLO ['-c', 'x']")


def test_an_uncaught_exception_reads_as_the_interpreter_writes_it(server, tmp_path):
    probe = script(tmp_path, "fails.py", """\
        print("before")
        def inner():
            raise KeyError("missing")
        inner()
    """)
    forked, fresh = both(server, [sys.executable, probe], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)
    assert forked.returncode == fresh.returncode == 1
    assert forked.stdout == fresh.stdout and forked.stdout.startswith("before\n")
    forked, fresh = both(server, [sys.executable, probe], capture_output=True, text=True,
                         timeout=60)
    assert forked.stderr == fresh.stderr
    assert forked.stderr.startswith(f'Traceback (most recent call last):\n  File "{probe}"')


def test_exit_waits_for_threads_then_runs_atexit_and_signals_read_as_subprocess_reads_them(
        server):
    code = ("import atexit, threading; atexit.register(print, 'atexit');"
            "threading.Thread(target=print, args=('thread',)).start();"
            "raise SystemExit('a message')")
    forked, fresh = both(server, [sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (1, "thread\natexit\n",
                                                                "a message\n")
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (1, "thread\natexit\n",
                                                              "a message\n")
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    forked, fresh = both(server, [sys.executable, "-c", kill], capture_output=True, timeout=60)
    assert forked.returncode == fresh.returncode == -signal.SIGTERM


def test_at_exit_what_the_commands_globals_held_is_finalized(server, tmp_path):
    """An unclosed file's buffer is written when the interpreter tears the module down (the
    function makes the globals a cycle: only a collection frees them)."""
    body = "def keep():\n    pass\nout = open({!r}, 'w'); out.write('kept')\n"
    for way in ("forked", "fresh"):
        written = tmp_path / way
        probe = script(tmp_path, f"{way}.py", body.format(str(written)))
        run = server.run if way == "forked" else subprocess.run
        assert run([sys.executable, probe], timeout=60).returncode == 0
        assert written.read_text() == "kept", way


def test_check_and_merged_stderr_behave_as_subprocess(server):
    forked, fresh = both(server, [sys.executable, "-c", "import sys; print('o'); sys.exit('e')"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert forked.stdout == fresh.stdout == b"o\ne\n" and forked.stderr is None
    with pytest.raises(subprocess.CalledProcessError) as failed:
        server.run([sys.executable, "-c", "raise SystemExit(3)"], capture_output=True,
                   check=True, timeout=60)
    assert failed.value.returncode == 3


def test_past_its_timeout_the_command_is_killed_and_its_output_so_far_kept(server, tmp_path):
    pid_file = tmp_path / "pid"
    code = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()));"
            "print('started', flush=True); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        server.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=5)
    assert expired.value.output == "started\n"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_commands_run_side_by_side(server, tmp_path):
    """The first waits for a file only the second writes: both end only if they overlap."""
    flag = tmp_path / "flag"
    waits = (f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.05)\n"
             "print('saw it')")
    results = {}
    waiter = threading.Thread(target=lambda: results.setdefault("waiter", server.run(
        [sys.executable, "-c", waits], capture_output=True, text=True, timeout=120)))
    waiter.start()
    writer = server.run([sys.executable, "-c", f"open({str(flag)!r}, 'w').close()"],
                        capture_output=True, timeout=60)
    waiter.join(130)
    assert writer.returncode == 0 and results["waiter"].stdout == "saw it\n"


@pytest.mark.parametrize("case", ["environment", "option", "other interpreter", "shadowed",
                                  "startup hook"])
def test_a_command_that_might_run_differently_forked_runs_fresh(server, tmp_path, case):
    env, args = dict(os.environ), [sys.executable, "-c", "import email; print(email.__file__)"]
    if case == "environment":  # read at import by modules the server has loaded
        env["LC_ALL"] = "C"
        reason = "environment LC_ALL"
    elif case == "option":
        args = [sys.executable, "-X", "utf8", *args[1:]]
        reason = "interpreter option -X"
    elif case == "other interpreter":
        args = ["/bin/sh", "-c", "echo /bin/sh"]
        reason = "not this interpreter"
    elif case == "shadowed":  # a folder on the path holds a package the server has imported
        (tmp_path / "email").mkdir()
        (tmp_path / "email" / "__init__.py").write_text("")
        env["PYTHONPATH"] = str(tmp_path)
        reason = f"{tmp_path} holds email"
    else:  # a fresh interpreter runs it at its start; the server started before
        (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.HOOKED = 1\n")
        env["PYTHONPATH"] = str(tmp_path)
        args = [sys.executable, "-c", "print(HOOKED)"]
        reason = f"{tmp_path} holds sitecustomize"
    before = server.fresh[reason]
    result = server.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert server.fresh[reason] == before + 1
    assert result.returncode == 0
    if case == "shadowed":
        assert result.stdout == f"{tmp_path / 'email' / '__init__.py'}\n"
    if case == "startup hook":
        assert result.stdout == "1\n"


def test_a_server_gone_under_a_command_fails_it_at_once(tmp_path):
    warm = Prewarmed(("json",))
    pid_file = tmp_path / "pid"
    code = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()));"
            "time.sleep(600)")
    killer = threading.Thread(target=lambda: (_wait_for(pid_file), warm.server.kill()))
    killer.start()
    try:
        with pytest.raises(PrewarmedError, match="went away"):
            warm.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, timeout=300)
    finally:
        killer.join(60)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        warm.close()


def _wait_for(path):
    import time
    while not path.exists():
        time.sleep(0.05)


def test_a_server_whose_preload_fails_says_why():
    with pytest.raises(PrewarmedError, match="no_such_module"):
        Prewarmed(("no_such_module",))
