"""bench/plot.py draws what the files say: bench results the real bench wrote against the
fake, and a memory-guard sample file, each series in the figure equal to the file's values,
and the PNG written."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from bench import bench_decode, plot, prompts
from tests.fakes import fake_vllm
from tests.timing import HANG_GUARD_S

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GIB = 1 << 30
NODES = ("192.0.2.10", "192.0.2.11")
FLOORS = {"load": 10 * GIB, "profile": 8 * GIB, "kv_ready": 3 * GIB, "serving": 2 * GIB}


def _bench(tmp_path, name, *fake_args):
    out = tmp_path / name
    with fake_vllm.spawn("--step-seconds", "0.002", "--ttft-seconds", "0.03",
                         *fake_args) as fake:
        code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--quiet", "--json",
                                  str(out), "--concurrency", "1,2,4", "--runs", "2",
                                  "--max-tokens", "48"])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plot")
    a = _bench(tmp, "a.json", "--num-spec-tokens", "5", "--accept-pattern", "5,2,0,3")
    b = _bench(tmp, "b.json", "--num-spec-tokens", "3", "--accept-pattern", "1,3")
    return a, b


def _by_gid(ax) -> dict:
    return {artist.get_gid(): artist for artist in [*ax.lines, *ax.collections, *ax.patches]
            if artist.get_gid()}


def _assert_bench_panels(axes, doc):
    """The four panels of one bench file against its cells."""
    speed, aggregate, accept, per_position = (_by_gid(ax) for ax in axes)
    cells = doc["cells"]
    phases = list(dict.fromkeys(c["phase"] for c in cells))
    assert phases == list(prompts.PHASES) == ["prose", "structured", "code"]
    for panel, key in ((speed, "per_stream_tok_s"), (aggregate, "aggregate_tok_s")):
        for phase in phases:
            mine = sorted((c for c in cells if c["phase"] == phase),
                          key=lambda c: c["concurrency"])
            line = panel[f"{key}/{phase}/median"]
            assert list(line.get_xdata()) == [c["concurrency"] for c in mine] == [1, 2, 4]
            assert list(line.get_ydata()) == [c[key]["median"] for c in mine]
            segments = panel[f"{key}/{phase}/range"].get_segments()
            assert [[tuple(p) for p in s] for s in segments] == [
                [(c["concurrency"], c[key]["min"]), (c["concurrency"], c[key]["max"])]
                for c in mine]
    for phase in phases:
        mine = sorted((c for c in cells if c["phase"] == phase), key=lambda c: c["concurrency"])
        line = accept[f"acceptance_length/{phase}"]
        assert list(line.get_xdata()) == [c["concurrency"] for c in mine]
        assert list(line.get_ydata()) == [c["acceptance_length"] for c in mine]
    assert len(per_position) == len(cells)
    for cell in cells:
        line = per_position[f"per_position/{cell['phase']}/c{cell['concurrency']}"]
        assert list(line.get_ydata()) == cell["per_position_acceptance"]
        assert list(line.get_xdata()) == list(range(len(cell["per_position_acceptance"])))


def test_bench_figure_draws_the_files_values(bench_files):
    doc = json.loads(bench_files[0].read_text())
    fig = plot.bench_figure(doc)
    _assert_bench_panels(fig.axes[:4], doc)
    # the fake drafted 5 tokens a step: 5 positions per cell, each a real rate
    assert all(len(c["per_position_acceptance"]) == 5 for c in doc["cells"])


def test_bench_png_is_written_and_valid(bench_files, capsys):
    out = bench_files[0].with_name("bench.png")
    assert plot.main([str(bench_files[0]), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(out) as image:
        image.verify()
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (13 * plot.DPI, round(9.5 * plot.DPI))
    assert capsys.readouterr().out.strip() == f"plot: wrote {out}"


def test_compare_puts_a_left_and_b_right(bench_files, capsys):
    a, b = bench_files
    docs = [json.loads(p.read_text()) for p in (a, b)]
    fig = plot.compare_figure(*docs)
    rows = [fig.axes[i:i + 2] for i in range(0, 8, 2)]    # row-major: A then B in each row
    for column, doc in enumerate(docs):
        _assert_bench_panels([row[column] for row in rows], doc)
    for row in rows:
        assert row[0].get_shared_y_axes().joined(row[0], row[1])
    assert plot.main(["--compare", str(a), str(b)]) == 0
    out = a.with_name("a-vs-b.png")
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert capsys.readouterr().out.strip() == f"plot: wrote {out}"


def test_bench_without_speculative_decoding_says_so(tmp_path):
    doc = json.loads(_bench(tmp_path, "plain.json").read_text())
    fig = plot.bench_figure(doc)
    accept, per_position = fig.axes[2], fig.axes[3]
    assert not accept.lines and not per_position.lines
    assert "no acceptance measured" in accept.texts[0].get_text()
    # the speeds are drawn all the same: a median line and a min-max bar per phase
    assert len(_by_gid(fig.axes[0])) == 2 * len(prompts.PHASES)


def _memory_csv(path):
    """What the guard writes for two nodes sampled 4 times a second through a boot; node 2
    entering each phase a little later and dipping under its kv_ready floor once."""
    phases = (("load", 0.0), ("profile", 20.0), ("kv_ready", 32.0), ("serving", 41.0))
    rows, t0 = [], 1_790_000_000.0
    for tick in range(50 * 4):
        elapsed = tick / 4
        for index, node in enumerate(NODES):
            lag = 0.5 * index
            phase = [p for p, start in phases if elapsed >= start + (lag if start else 0)][-1]
            available = int((110 - 2.1 * elapsed) * GIB) if elapsed < 48 else int(9 * GIB)
            if index == 1 and tick == 150:
                available = FLOORS["kv_ready"] - 123_456_789
            rows.append([f"{t0 + elapsed + 0.01 * index:.3f}", f"{elapsed + 0.01 * index:.3f}",
                         node, phase, str(max(available, 0)), str(FLOORS[phase])])
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(plot.MEMORY_HEADER)
        writer.writerows(rows)
    return rows


def test_memory_figure_draws_every_sample_phase_and_floor(tmp_path):
    path = tmp_path / "memory.csv"
    rows = _memory_csv(path)
    samples = plot.load_memory_samples(str(path))
    assert len(samples) == len(rows) == 400
    ax = plot.memory_figure(samples).axes[0]
    artists = _by_gid(ax)
    for node in NODES:
        mine = [r for r in rows if r[2] == node]
        line = artists[f"mem_available/{node}"]
        assert list(line.get_xdata()) == [float(r[1]) for r in mine]
        assert list(line.get_ydata()) == [int(r[4]) / GIB for r in mine]
        floor = artists[f"floor/{node}"]
        assert floor.get_drawstyle() == "steps-post"
        assert list(floor.get_ydata()) == [int(r[5]) / GIB for r in mine]
    dip = artists[f"under_floor/{NODES[1]}"].get_offsets().tolist()
    assert dip == [[37.51, (FLOORS["kv_ready"] - 123_456_789) / GIB]]
    assert f"under_floor/{NODES[0]}" not in artists
    spans = {gid.split("/")[1]: artists[gid] for gid in artists if gid.startswith("phase/")}
    assert list(spans) == ["load", "profile", "kv_ready", "serving"]
    edges = [(round(s.get_x(), 3), round(s.get_x() + s.get_width(), 3)) for s in spans.values()]
    assert edges == [(0.0, 20.0), (20.0, 32.0), (32.0, 41.0), (41.0, 49.76)]


def test_memory_png_is_written_beside_the_samples(tmp_path, capsys):
    path = tmp_path / "memory.csv"
    _memory_csv(path)
    assert plot.main([str(path)]) == 0
    out = tmp_path / "memory.png"
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (13 * plot.DPI, round(6.5 * plot.DPI))
    assert capsys.readouterr().out.strip() == f"plot: wrote {out}"


@pytest.mark.parametrize("text,message", [
    ("time,node\n1,a\n", ("the first line must be time_unix,elapsed_s,node,phase,"
                          "mem_available_bytes,floor_bytes (a memory guard sample file)")),
    (",".join(plot.MEMORY_HEADER) + "\n", "no samples after the header"),
    (",".join(plot.MEMORY_HEADER) + "\n1,0,n1,boot,100,10\n",
     ":2: phase 'boot' is not one of load, profile, kv_ready, serving"),
    (",".join(plot.MEMORY_HEADER) + "\n1,0,n1,load,lots,10\n",
     ":2: mem_available_bytes 'lots' is not a number >= 0"),
    (",".join(plot.MEMORY_HEADER) + "\n1,0,n1,load,100\n", ":2: 5 fields, the header has 6"),
])
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "input.csv"
    path.write_text(text)
    assert plot.main([str(path), "-o", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(path) in err
    assert not (tmp_path / "out.png").exists()


def test_a_json_that_is_no_bench_result_is_refused(tmp_path, capsys):
    path = tmp_path / "probes.json"
    path.write_text('{"schema": "probes/1"}')
    assert plot.main([str(path)]) == 2
    assert "probes.json: not a bench_decode/1 result" in capsys.readouterr().err


def test_output_may_not_overwrite_an_input(bench_files, capsys):
    a, b = bench_files
    assert plot.main(["--compare", str(a), str(b), "-o", str(b)]) == 2
    assert "the output would overwrite an input" in capsys.readouterr().err
    assert json.loads(b.read_text())["schema"] == "bench_decode/1"


def test_the_command_runs_as_a_script(tmp_path):
    path = tmp_path / "memory.csv"
    _memory_csv(path)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "plot.py"), str(path),
                             "-o", str(tmp_path / "boot.png")], cwd="/", capture_output=True,
                            text=True, check=False, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "boot.png").read_bytes()[:8] == PNG_SIGNATURE
