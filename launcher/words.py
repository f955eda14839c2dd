"""Split a setting into shell words without evaluating it: python3 words.py NAME VALUE.

Prints the words NUL-terminated (bash reads them with `mapfile -d ''`). Quotes group,
backslashes escape, and nothing expands or runs, so JSON and spaces survive as written.
"""

import shlex
import sys


def main(argv):
    name, value = argv[1], argv[2]
    try:
        words = shlex.split(value, comments=False, posix=True)
    except ValueError as error:
        print(f"refused: {name}={value}: {error}; accepted: shell words "
              "(quote a word that holds spaces or JSON)", file=sys.stderr)
        return 2
    sys.stdout.write("".join(word + "\0" for word in words))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
