"""recipekit/text_integrity.py: every check fails on corrupted text and passes on clean text;
each threshold is held at its edge."""

import pytest

from recipekit import text_integrity as integrity
from recipekit.text_integrity import JAPANESE, KOREAN, KOREAN_WITH_EMOJI, judge

KOREAN_SENTENCE = "퍼셉트론은 입력에 가중치를 곱해 더한 값으로 출력을 정합니다. "
JAPANESE_SENTENCE = "パーセプトロンは入力に重みを掛けて足し合わせ、その値で出力を決めます。"


def korean(chars: int = 450) -> str:
    """Korean prose of exactly CHARS characters, none of them trailing space."""
    text = (KOREAN_SENTENCE * (chars // len(KOREAN_SENTENCE) + 1))[:chars]
    return text[:-1] + "다" if text.endswith(" ") else text


def utf8_tokens(text: str) -> list[list[int]]:
    return [list(char.encode()) for char in text]


@pytest.mark.parametrize("text,field,count", [
    ("가나\ufffd다", "replacement", 1),
    ("가나\ud83d다", "surrogates", 1),
    ("가나\x1b[0m다\x00", "controls", 2),
    ("가나\r다", "controls", 1),
    ("가\x85나", "controls", 1),   # a C1 control: bytes read as Latin-1 leave these
])
def test_each_text_fault_is_counted(text, field, count):
    faults = integrity.text_faults(text)
    assert getattr(faults, field) == count and faults.total == count


def test_newline_tab_and_emoji_are_not_faults():
    assert integrity.text_faults("가\n나\t다 🎂 ✈️ \U0001F600").total == 0


def test_a_character_split_over_tokens_is_whole_once_joined():
    emoji = "🎂".encode()
    found = integrity.token_byte_faults([list(emoji[:1]), list(emoji[1:3]), list(emoji[3:]),
                                         list(b" ok")], cut_allowed=False)
    assert (found.invalid, found.first_token, found.cut_at_end) == (0, None, False)


def test_a_lone_lead_byte_before_a_new_character_is_one_invalid_sequence():
    tokens = [list("가".encode()), [0xEA], list("나".encode()), [0xEB, 0x82], [0x41]]
    found = integrity.token_byte_faults(tokens, cut_allowed=False)
    assert found.invalid == 2 and found.first_token == 1
    assert found.first_bytes == "ea b0 80 ea eb 82 98"


def test_an_incomplete_last_character_is_a_fault_unless_the_answer_was_cut():
    tokens = [list("가".encode()), [0xEB, 0x82]]
    assert integrity.token_byte_faults(tokens, cut_allowed=False).invalid == 1
    cut = integrity.token_byte_faults(tokens, cut_allowed=True)
    assert (cut.invalid, cut.cut_at_end) == (0, True)


def test_a_clean_conclusive_korean_answer_is_clean():
    text = korean()
    found = judge(KOREAN, text, "", utf8_tokens(text), "stop")
    assert found.verdict == "clean" and found.faults == 0
    assert found.script_share == 1.0 and found.chars == 450
    assert found.counts() == ("0 U+FFFD, 0 lone surrogates, 0 control chars in the answer; 0 "
                              "invalid UTF-8 sequences in 450 tokens' bytes")


@pytest.mark.parametrize("content,reasoning,tokens,why", [
    (korean()[:200] + "\ufffd" + korean()[200:], "", None, "1 U+FFFD"),
    (korean(), "생각\ufffd", None, "1 U+FFFD, 0 lone surrogates, 0 control chars in the reasoning"),
    (korean(), "", [*utf8_tokens(korean()[:9]), [0xEA], *utf8_tokens(korean()[9:])],
     "1 invalid UTF-8 sequences in 451 tokens' bytes (first at token 9"),
    # a fault is a fault in a short or off-language answer too
    ("Short answer \ud800", "", None, "1 lone surrogates"),
])
def test_any_fault_fails_the_run(content, reasoning, tokens, why):
    found = judge(KOREAN, content, reasoning, tokens, "stop")
    assert found.verdict == "fault" and why in found.why, found.why


@pytest.mark.parametrize("language,content,why", [
    (KOREAN, "", "empty answer (finish_reason stop)"),
    (KOREAN, korean(399), "answer of 399 chars, under 400"),
    (KOREAN, ("A perceptron weighs its inputs and sums them. " * 12),
     "off-language: 0% of its letters in Hangul, under 60%"),
    (KOREAN, "1234567890 " * 40,
     "off-language: no letters at all (digits, punctuation or symbols only)"),
    # Chinese: kanji without kana
    (JAPANESE, "感知器将输入乘以权重后相加再通过激活函数得到输出。" * 20,
     "not Japanese: kana 0% of its letters, under 20%"),
    (KOREAN_WITH_EMOJI, korean(440) + " 🎂 🎈 🎁 🌊", "4 emoji, under 5"),
])
def test_an_unusable_answer_is_inconclusive_never_clean(language, content, why):
    found = judge(language, content, "", utf8_tokens(content), "stop")
    assert found.verdict == "inconclusive" and found.why == why, found.why


def test_the_thresholds_hold_at_their_edges():
    assert judge(KOREAN, korean(400), "", None, "length").verdict == "clean"
    # 60 Hangul and 40 Latin letters: 60% of the letters
    mixed = ("가" * 60 + "a" * 40 + " ") * 5
    assert judge(KOREAN, mixed, "", None, "stop").verdict == "clean"
    short = ("가" * 59 + "a" * 41 + " ") * 5
    assert judge(KOREAN, short, "", None, "stop").verdict == "inconclusive"
    japanese = (JAPANESE_SENTENCE * 12)
    assert judge(JAPANESE, japanese, "", None, "stop").verdict == "clean"
    emoji = korean(440) + " 🎂 🎈 🎁 🌊 🍊"
    assert judge(KOREAN_WITH_EMOJI, emoji, "", None, "stop").verdict == "clean"


def test_token_bytes_not_given_are_said_not_counted():
    found = judge(KOREAN, korean(), "", None, "stop")
    assert found.token_bytes is None and found.counts().endswith("token bytes not given")


@pytest.mark.parametrize("text,found", [
    ('알겠습니다. <tool_call>get_weather\n<arg_key>city</arg_key>', ["<tool_call>", "<arg_key>",
                                                                    "</arg_key>"]),
    ("값은 서울</arg_value>", ["</arg_value>"]),
    ("<|observation|>", ["<|observation|>"]),
    ("서울은 맑고 21도입니다. 도구 호출은 끝났습니다.", []),
])
def test_leaked_tool_markup_is_found(text, found):
    assert integrity.leaked_markup(text) == found


@pytest.mark.parametrize("text,unit,copies", [
    ("메모를 저장했습니다. " + "네, 저장했어요. " * 12, " 네, 저장했어요.", 12),
    ("ok " + "ㅋ" * 60, "ㅋ", 60),
    ("start " + '{"city": "서울"}' * 5, '{"city": "서울"}', 5),
])
def test_a_repeating_tail_is_found(text, unit, copies):
    found = integrity.repeating_tail(text)
    assert found is not None and (found.unit, found.copies) == (unit, copies)


@pytest.mark.parametrize("text", [
    "서울은 맑고 21도입니다. 좋은 하루 보내세요!!!",
    "ㅎㅎㅎㅎ 고마워요",
    # three copies under 60 characters; 59 characters of one letter
    "답: " + "좋아요. " * 3,
    "x" * 59,
    # a repeat that is not at the end
    "네, 저장했어요. " * 12 + "그럼 이만 마치겠습니다. 다음에 또 물어봐 주세요.",
    "",
])
def test_a_finished_answer_has_no_repeating_tail(text):
    assert integrity.repeating_tail(text) is None
