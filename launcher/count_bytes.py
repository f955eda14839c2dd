"""Copy stdin to stdout and report the bytes copied on stderr: the progress meter used when
streaming an image to a worker and `pv` is not installed. python3 count_bytes.py LABEL [TOTAL]
"""

import sys
import time

_CHUNK = 1 << 20
_REPORT_EVERY_SECONDS = 2.0


def _report(label, copied, total, final=False):
    gib = copied / (1 << 30)
    share = f" of {total / (1 << 30):.2f} GiB ({100 * copied / total:.0f}%)" if total else ""
    end = "\n" if final else "\r"
    sys.stderr.write(f"{label}: {gib:.2f} GiB{share}{end}")
    sys.stderr.flush()


def main(argv):
    label = argv[1]
    total = int(argv[2]) if len(argv) > 2 and argv[2].isdigit() else 0
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    copied, last = 0, 0.0
    while chunk := source.read(_CHUNK):
        sink.write(chunk)
        copied += len(chunk)
        now = time.monotonic()
        if now - last >= _REPORT_EVERY_SECONDS:
            _report(label, copied, total)
            last = now
    sink.flush()
    _report(label, copied, total, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
