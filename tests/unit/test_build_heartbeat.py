"""scripts/build.sh's heartbeat during a layer build: the log's path first, then every
interval the time so far and the log's last line, until the build returns. The interval's
waits are scripted here (no clock is raced)."""

from recipekit.imagebuild.heartbeat import Heartbeat, beat_line, last_line


def test_the_last_line_is_the_last_non_blank_one_cut_to_its_width(tmp_path):
    log = tmp_path / "v8.log"
    assert last_line(log) == ""
    log.write_text("Step 1/4 : FROM x\n" + "Step 3/4 : RUN " + "y" * 300 + "\n\n")
    assert last_line(log) == ("Step 3/4 : RUN " + "y" * 300)[:160]


def test_a_beat_names_the_time_so_far_and_the_last_line(tmp_path):
    log = tmp_path / "v8.log"
    assert beat_line("v8", 5, log) == "v8: still building, 0 min 05 s; last log line: (none yet)"
    log.write_text("glm53 layer: v8 probe\n")
    assert beat_line("v8", 61.9, log) == "v8: still building, 1 min 01 s; last log line: glm53 layer: v8 probe"


def test_it_names_the_log_then_beats_until_the_build_returns(tmp_path):
    log = tmp_path / "v8.log"
    log.write_text("Step 2/4 : COPY . /opt\n")
    said, waits, clock = [], iter([False, False, True]), iter([100.0, 130.0, 160.0])
    with Heartbeat("v8", log, said.append, "build/logs/v8.log", wait=lambda every: next(waits),
                   clock=lambda: next(clock)) as beating:
        beating.thread.join()  # the scripted waits end it; a real one ends at the block's end
    assert said == [
        "v8: its log is build/logs/v8.log (a line every 30 s while it builds)",
        "v8: still building, 0 min 30 s; last log line: Step 2/4 : COPY . /opt",
        "v8: still building, 1 min 00 s; last log line: Step 2/4 : COPY . /opt"]


def test_a_build_that_returns_at_once_ends_the_beat_without_one(tmp_path):
    said = []
    with Heartbeat("v9", tmp_path / "v9.log", said.append, "build/logs/v9.log", every_s=3600):
        pass
    assert said == ["v9: its log is build/logs/v9.log (a line every 3600 s while it builds)"]
