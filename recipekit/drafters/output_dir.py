"""The --out directory: created new, or replaced only if it is wholly a previous output of ours.

Building happens in a sibling temporary directory that is renamed into place, so a
refusal or crash never leaves a half-prepared drafter where vLLM would read it.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

from .errors import UsageError

MARKER = ".prepare-drafter.json"


def _inside(path, parent):
    return path == parent or parent in path.parents


def check_out(out, snapshot_dir):
    """Refuse an --out that overlaps the snapshot or holds anything this tool did not write."""
    out_real, snapshot_real = out.resolve(), snapshot_dir.resolve()
    if _inside(out_real, snapshot_real) or _inside(snapshot_real, out_real):
        raise UsageError(
            f"--out {out} overlaps the snapshot {snapshot_dir}; choose a directory outside it"
        )
    if not os.path.lexists(out):
        return
    marker = out / MARKER
    if out.is_symlink() or not out.is_dir() or not marker.is_file():
        raise UsageError(
            f"--out {out} exists and is not a previous prepare-drafter output; "
            "choose a new directory or remove it yourself"
        )
    try:
        written = set(json.loads(marker.read_text(encoding="utf-8"))["entries"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            f"{marker} is unreadable; remove {out} yourself or choose a new directory"
        ) from None
    foreign = sorted(set(os.listdir(out)) - written - {MARKER})
    if foreign:
        raise UsageError(
            f"--out {out} holds {foreign[0]}, which prepare-drafter did not write; "
            "move it away or choose a new directory"
        )


def write_out(out, snapshot_dir, build, summary):
    """Run build(tmp) -> entry names, record them with `summary`, and swap tmp in as `out`."""
    check_out(out, snapshot_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    try:
        entries = sorted(build(tmp))
        (tmp / MARKER).write_text(
            json.dumps({"entries": entries, "summary": summary}, indent=2) + "\n", encoding="utf-8"
        )
        os.chmod(
            tmp, 0o755
        )  # mkdtemp makes it private; the serving container reads it as another user
        if os.path.lexists(out):
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rename(out, old / "previous")
            os.rename(tmp, out)
            shutil.rmtree(old)  # symlinks are unlinked, never followed
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
