"""Is served text whole? The counts and verdicts that bench/probes.py's multibyte and
tool_cycles probes and the launcher's start-up self-check share (docs/probes.md).

Standard library only: the launcher runs on the head with python3 alone.

A fault is what no healthy model writes: U+FFFD (a decoder met bytes that are not UTF-8),
a lone surrogate (half of a UTF-16 pair, which JSON can carry), a control character other
than newline and tab, mojibake (UTF-8 read as CP1252 or Latin-1), token bytes whose
concatenation is not UTF-8, or a text that ends in a loop. Any fault fails a run, whatever
its language or length. A run without faults is judged clean only when it is conclusive:
every check ran (the token bytes were given) and the answer has at least MIN_ANSWER_CHARS in
the asked script; a short, empty, off-language or failed answer, or one whose bytes went
unchecked, is inconclusive, never clean.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

# The field's probe (tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark #10): this prompt,
# max_tokens 700, temperature 0, non-streamed, three runs: LibertAIDAI's ModelOpt build gave
# 4, 9 and 8 U+FFFD, RedHatAI's compressed-tensors build 0, 0 and 0.
FIELD_PROMPT = ("한국어로 퍼셉트론과 신경망의 차이를 자세히 설명해 주세요. "
                "최소 400자 이상으로 작성하세요.")
FIELD_MAX_TOKENS = 700
# the field's length rule: the prompt asks for 400 characters, and fewer gives the bug
# fewer chances than the field's runs had
MIN_ANSWER_CHARS = 400
# Share of the answer's letters (Unicode category L*: not spaces, digits, punctuation or
# emoji) in the asked script. A Korean or Japanese technical answer keeps its Latin terms
# (Perceptron, XOR, ReLU) well under 40% of its letters; an answer that switched to English
# or Chinese falls far below 60%.
MIN_SCRIPT_SHARE = 0.6
# Japanese is kana and kanji; Chinese is kanji alone, so kana must be a fifth of the letters
# (Japanese prose is mostly kana).
MIN_KANA_SHARE = 0.2
# The emoji prompts ask one per sentence; five four-byte sequences are five chances for a
# corrupted byte token, and a 400-character answer has well over five sentences.
MIN_EMOJI = 5
# A repeating tail (a looped text): a unit of 1 to MAX_REPEAT_UNIT characters written at
# least MIN_REPEAT_COPIES times back to back at the end, covering MIN_REPEAT_CHARS or more. A
# finished answer does not end by saying the same 20 characters three times in a row, nor
# does a healthy one cut by max_tokens; a parser that lost sync and a model locked in a loop
# (the degenerate repetition of vLLM #56868) do, until max_tokens. A unit of 200 fits three
# times in the 700-token answers judged here; shorter loops, a sentence, are the field's.
MAX_REPEAT_UNIT = 200
MIN_REPEAT_COPIES = 3
MIN_REPEAT_CHARS = 60
# Tool-call markup of the chat templates served here (GLM's glm47 and the hermes tags)
# that belongs in a parsed tool_calls entry, never in text.
TOOL_MARKUP = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
               "</arg_value>", "<tool_response>", "</tool_response>", "<|observation|>",
               "<|assistant|>", "<|user|>", "<|system|>")

# Mojibake: a word's UTF-8 bytes read one byte a character by a CP1252 or Latin-1 decoder
# ("한국" shows as "í•œêµ­"). Read back to bytes, such a stretch decodes as UTF-8 again. A
# stretch counts once it decodes to MIN_MOJIBAKE_CHARS characters or more, or to one of four
# bytes: legit Latin text can spell one UTF-8 character by chance, an accented letter before
# one or two marks (French "voilà »" with its no-break space is E0 A0 BB, "café”…" is
# E9 94 85, German "Fuß“" is DF 93), never two in a row; a mis-read word of two or more
# Hangul, kana or kanji gives two or more, a mis-read emoji ("ðŸ˜€") one of four bytes.
MIN_MOJIBAKE_CHARS = 2
# What a verdict says when the answer came without token bytes: a check planned and not run
BYTE_CHECK_NOT_RUN = "token byte check not run: no token bytes given"

HANGUL = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF))
KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F))
HAN = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3134F))
# the emoji blocks of plane 1: four bytes each in UTF-8
EMOJI = ((0x1F000, 0x1FAFF),)


def _within(char: str, ranges: tuple[tuple[int, int], ...]) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in ranges)


@dataclass(frozen=True)
class Language:
    """What a run's answer must be written in to be conclusive."""

    name: str
    script: str                        # the script's name, as a verdict says it
    ranges: tuple[tuple[int, int], ...]
    min_kana_share: float = 0.0
    min_emoji: int = 0


KOREAN = Language("ko", "Hangul", HANGUL)
JAPANESE = Language("ja", "kana and kanji", KANA + HAN, min_kana_share=MIN_KANA_SHARE)
KOREAN_WITH_EMOJI = Language("emoji", "Hangul", HANGUL, min_emoji=MIN_EMOJI)


@dataclass(frozen=True)
class TextFaults:
    replacement: int = 0               # U+FFFD
    surrogates: int = 0                # lone surrogates
    controls: int = 0                  # Cc characters other than newline and tab
    mojibake: int = 0                  # stretches of UTF-8 read as CP1252 or Latin-1

    @property
    def total(self) -> int:
        return self.replacement + self.surrogates + self.controls + self.mojibake

    def phrase(self, where: str) -> str:
        """The counts in one phrase: where is the text's name (the answer, the reasoning)."""
        return (f"{self.replacement} U+FFFD, {self.surrogates} lone surrogates, "
                f"{self.controls} control chars, {self.mojibake} mojibake runs in the {where}")

    def to_json(self) -> dict:
        return {"replacement": self.replacement, "surrogates": self.surrogates,
                "controls": self.controls, "mojibake": self.mojibake}


def text_faults(text: str) -> TextFaults:
    replacement = surrogates = controls = 0
    for char in text:
        if char == "\ufffd":
            replacement += 1
        elif 0xD800 <= ord(char) <= 0xDFFF:
            # json decodes a valid escaped pair to one character: what is left is lone
            surrogates += 1
        elif char not in "\n\t" and unicodedata.category(char) == "Cc":
            controls += 1
    return TextFaults(replacement, surrogates, controls, len(mojibake(text)))


def _read_as_byte(char: str) -> int | None:
    """The byte 0x80-0xFF that a CP1252 or Latin-1 decoder turned into CHAR, else None.
    Latin-1 maps every byte to the code point of its value; CP1252 agrees from 0xA0 on and
    puts punctuation and letters at 0x80-0x9F (its five unassigned bytes read as Latin-1)."""
    if 0x80 <= ord(char) <= 0xFF:
        return ord(char)
    try:
        raw = char.encode("cp1252")
    except UnicodeEncodeError:
        return None
    return raw[0] if raw[0] >= 0x80 else None


def _utf8_length(lead: int) -> int:
    """How many bytes a UTF-8 sequence starting with LEAD holds; 0 when it starts none."""
    return 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
        4 if 0xF0 <= lead <= 0xF4 else 0


def _misread_stretches(chars: str) -> list[tuple[str, str]]:
    """(as shown, as meant) for each stretch of CHARS (all read as bytes) whose bytes are
    consecutive whole UTF-8 characters, two or more, or one of four bytes."""
    data = bytes(_read_as_byte(char) for char in chars)
    found, start, position, meant = [], 0, 0, ""

    def close(end: int) -> None:
        if len(meant) >= MIN_MOJIBAKE_CHARS or (meant and len(meant.encode()) == 4):
            found.append((chars[start:end], meant))

    while position < len(data):
        size = _utf8_length(data[position])
        try:
            char = data[position:position + size].decode("utf-8") if size else ""
        except UnicodeDecodeError:
            char = ""
        if char:
            start = position if not meant else start
            meant += char
            position += size
        else:
            close(position)
            meant, position = "", position + 1
    close(position)
    return found


def mojibake(text: str) -> list[tuple[str, str]]:
    """The stretches of TEXT that are UTF-8 read as CP1252 or Latin-1, each (as shown, as
    meant): a stretch decodes as UTF-8 once read back to bytes, to MIN_MOJIBAKE_CHARS
    characters or more or to one of four bytes ("í•œêµ­" -> "한국")."""
    found, run = [], ""
    for char in text + "\0":       # the end closes the last run
        if _read_as_byte(char) is not None:
            run += char
            continue
        if run:
            found += _misread_stretches(run)
        run = ""
    return found


@dataclass(frozen=True)
class ByteFaults:
    """Invalid UTF-8 in the concatenated bytes of the output tokens."""

    tokens: int                        # tokens whose bytes were given
    invalid: int                       # maximal invalid subsequences (one per bad stretch)
    first_token: int | None            # index of the token where the first one starts
    first_bytes: str | None            # the bytes around it, hex
    cut_at_end: bool                   # the last character is incomplete (max_tokens cut it)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def token_byte_faults(token_bytes: list[list[int] | bytes], cut_allowed: bool) -> ByteFaults:
    """Concatenate each token's bytes and decode the whole: a multi-byte character split over
    tokens is whole once joined, so only bytes that no continuation can complete count. An
    incomplete last character counts too unless the answer was cut (cut_allowed)."""
    data, starts = bytearray(), []
    for piece in token_bytes:
        starts.append(len(data))
        data.extend(piece)
    invalid, first, position, cut = 0, None, 0, False
    while position < len(data):
        try:
            bytes(data[position:]).decode("utf-8")
            break
        except UnicodeDecodeError as error:
            start, end = position + error.start, position + error.end
            if end == len(data) and error.reason == "unexpected end of data" and cut_allowed:
                cut = True
                break
            invalid += 1
            first = start if first is None else first
            position = end
    first_token = None if first is None else max(i for i, s in enumerate(starts) if s <= first)
    shown = None if first is None else bytes(data[max(0, first - 3):first + 4]).hex(" ")
    return ByteFaults(len(token_bytes), invalid, first_token, shown, cut)


@dataclass(frozen=True)
class Script:
    letters: int
    share: float | None                # letters in the asked script / letters
    kana_share: float | None
    emoji: int


def script_of(text: str, language: Language) -> Script:
    letters = in_script = kana = emoji = 0
    for char in text:
        if _within(char, EMOJI):
            emoji += 1
        elif unicodedata.category(char).startswith("L"):
            letters += 1
            in_script += _within(char, language.ranges)
            kana += _within(char, KANA)
    if not letters:
        return Script(0, None, None, emoji)
    return Script(letters, in_script / letters, kana / letters, emoji)


@dataclass
class Judgement:
    """One answer judged: its counts, its length and script, and the verdict."""

    language: str
    verdict: str                       # clean, fault or inconclusive
    why: str                           # one phrase: what made the verdict
    chars: int
    script_share: float | None
    kana_share: float | None
    emoji: int
    answer: TextFaults
    reasoning: TextFaults
    answer_repeat: Repetition | None   # the answer's repeating tail, if it has one
    reasoning_repeat: Repetition | None
    token_bytes: ByteFaults | None     # None: the server gave no token bytes (check not run)

    @property
    def faults(self) -> int:
        return (self.answer.total + self.reasoning.total
                + (self.answer_repeat is not None) + (self.reasoning_repeat is not None)
                + (self.token_bytes.invalid if self.token_bytes else 0))

    @property
    def byte_check_ran(self) -> bool:
        return self.token_bytes is not None

    def counts(self) -> str:
        """The counts, one phrase: what the self-check line and a probe's run say."""
        text = self.answer.phrase("answer")
        if self.reasoning.total:
            text += "; " + self.reasoning.phrase("reasoning")
        repeats = [repeat.phrase(where) for where, repeat in
                   (("answer", self.answer_repeat), ("reasoning", self.reasoning_repeat))
                   if repeat is not None]
        text += "; " + ("; ".join(repeats) if repeats else "no repeating tail")
        if self.token_bytes is None:
            text += f"; {BYTE_CHECK_NOT_RUN}"
        else:
            text += (f"; {self.token_bytes.invalid} invalid UTF-8 sequences in "
                     f"{self.token_bytes.tokens} tokens' bytes")
            if self.token_bytes.first_token is not None:
                text += (f" (first at token {self.token_bytes.first_token}: "
                         f"{self.token_bytes.first_bytes})")
        return text

    def shape(self) -> str:
        share = "-" if self.script_share is None else f"{self.script_share:.0%}"
        text = f"{self.chars} chars, {share} of letters in the script"
        return text + (f", {self.emoji} emoji" if self.emoji else "")

    def to_json(self) -> dict:
        return {"language": self.language, "verdict": self.verdict, "why": self.why,
                "chars": self.chars, "script_share": self.script_share,
                "kana_share": self.kana_share, "emoji": self.emoji,
                "answer_faults": self.answer.to_json(),
                "reasoning_faults": self.reasoning.to_json(),
                "answer_repeat": self.answer_repeat and self.answer_repeat.to_json(),
                "reasoning_repeat": self.reasoning_repeat and self.reasoning_repeat.to_json(),
                "byte_check": "run" if self.byte_check_ran else "not run",
                "token_bytes": self.token_bytes.to_json() if self.token_bytes else None}


def _percent(value: float | None) -> str:
    return "none" if value is None else f"{value:.0%}"


def judge(language: Language, content: str, reasoning: str,
          token_bytes: list | None, finish_reason: str | None) -> Judgement:
    """One answer's verdict: fault when anything is counted (answer, reasoning, a repeating
    tail, token bytes); else inconclusive when the answer is empty, short or off-language, or
    when no token bytes came (the byte check did not run); else clean."""
    answer, thought = text_faults(content), text_faults(reasoning)
    usable = token_bytes is not None and all(isinstance(b, (list, bytes)) for b in token_bytes)
    byte_faults = (token_byte_faults(token_bytes, cut_allowed=finish_reason == "length")
                   if usable and token_bytes else None)
    script = script_of(content, language)
    chars = len(content.strip())
    found = Judgement(language.name, "clean", "", chars, script.share, script.kana_share,
                      script.emoji, answer, thought, repeating_tail(content),
                      repeating_tail(reasoning), byte_faults)
    if found.faults:
        found.verdict, found.why = "fault", found.counts()
    elif not chars:
        found.verdict = "inconclusive"
        found.why = f"empty answer (finish_reason {finish_reason})"
    elif chars < MIN_ANSWER_CHARS:
        found.verdict = "inconclusive"
        found.why = f"answer of {chars} chars, under {MIN_ANSWER_CHARS}"
    elif script.share is None:
        found.verdict = "inconclusive"
        found.why = "off-language: no letters at all (digits, punctuation or symbols only)"
    elif script.share < MIN_SCRIPT_SHARE:
        found.verdict = "inconclusive"
        found.why = (f"off-language: {_percent(script.share)} of its letters in "
                     f"{language.script}, under {MIN_SCRIPT_SHARE:.0%}")
    elif (script.kana_share or 0.0) < language.min_kana_share:
        found.verdict = "inconclusive"
        found.why = (f"not Japanese: kana {_percent(script.kana_share)} of its letters, under "
                     f"{language.min_kana_share:.0%}")
    elif script.emoji < language.min_emoji:
        found.verdict = "inconclusive"
        found.why = f"{script.emoji} emoji, under {language.min_emoji}"
    elif not found.byte_check_ran:
        # every planned check must run before a run is clean
        found.verdict, found.why = "inconclusive", BYTE_CHECK_NOT_RUN
    else:
        found.why = "clean"
    return found


def leaked_markup(text: str) -> list[str]:
    """The tool-call markup found in TEXT, in TOOL_MARKUP's order."""
    return [tag for tag in TOOL_MARKUP if tag in text]


@dataclass(frozen=True)
class Repetition:
    unit: str
    copies: int
    chars: int

    def phrase(self, where: str) -> str:
        return f"the {where} ends repeating {self.unit!r} {self.copies} times ({self.chars} chars)"

    def to_json(self) -> dict:
        return dict(self.__dict__)


def repeating_tail(text: str) -> Repetition | None:
    """The shortest unit that ends TEXT repeated MIN_REPEAT_COPIES or more times back to back
    over MIN_REPEAT_CHARS or more, else None (trailing whitespace ignored)."""
    text = text.rstrip()
    size = len(text)
    for unit in range(1, min(MAX_REPEAT_UNIT, size // MIN_REPEAT_COPIES) + 1):
        # how far back text[i] == text[i - unit] holds from the end
        same = 0
        while same < size - unit and text[size - 1 - same] == text[size - 1 - same - unit]:
            same += 1
        covered = same + unit
        copies = covered // unit
        if copies >= MIN_REPEAT_COPIES and covered >= MIN_REPEAT_CHARS:
            return Repetition(text[size - unit:], copies, covered)
    return None
