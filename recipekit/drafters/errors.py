"""The two ways preparing a drafter stops: the input is refused, or the command was misused."""


class Refused(Exception):
    """A snapshot file holds a value past a bound; the message is one actionable line."""

    def __init__(self, file, field, value, bound, action=""):
        self.file = str(file)
        self.field = field
        self.value = value
        self.bound = bound
        self.action = action
        text = f"{self.file}: {field} = {value!r} refused: {bound}"
        if action:
            text += f"; {action}"
        super().__init__(text)


class UsageError(Exception):
    """The command line asks for something this tool will not do (one line, says what to do)."""
