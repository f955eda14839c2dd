"""recipekit/text_integrity.py: every check fails on corrupted text and passes on clean text;
each threshold is held at its edge."""

import pytest

from recipekit import text_integrity as integrity
from recipekit.text_integrity import JAPANESE, KOREAN, KOREAN_WITH_EMOJI, judge

# Normal long answers, every sentence its own (a healthy answer does not loop): the field's
# question answered in Korean, Japanese, Chinese and English
KOREAN_ANSWER = (
    "퍼셉트론은 1958년 프랭크 로젠블랫이 제안한 가장 단순한 형태의 인공 신경 모델입니다. "
    "입력값마다 가중치를 곱한 뒤 모두 더하고, 그 합이 임계값을 넘으면 1을, 넘지 않으면 0을 "
    "출력합니다. 이 구조 덕분에 퍼셉트론은 직선 하나로 두 집단을 나눌 수 있는 문제를 잘 풉니다. "
    "하지만 XOR처럼 직선 하나로 나눌 수 없는 문제 앞에서는 한계가 분명합니다. 신경망은 이러한 "
    "단위를 여러 층으로 쌓아 올린 구조로, 입력층과 은닉층과 출력층으로 이루어집니다. 은닉층의 "
    "뉴런들은 시그모이드나 ReLU 같은 비선형 활성화 함수를 사용합니다. 비선형성이 더해지면 "
    "신경망은 곡선 형태의 복잡한 경계도 표현할 수 있게 됩니다. 학습 방법에도 차이가 있는데, "
    "퍼셉트론은 틀린 예제가 나올 때마다 가중치를 조금씩 고칩니다. 다층 신경망은 역전파 "
    "알고리즘으로 출력의 오차를 각 층의 가중치까지 거슬러 전달합니다. 경사 하강법은 이렇게 계산된 "
    "기울기를 따라 손실이 줄어드는 방향으로 매개변수를 움직입니다. 그 결과 신경망은 이미지 인식, "
    "번역, 음성 처리처럼 훨씬 어려운 과제를 다룰 수 있습니다. 물론 층이 깊어질수록 필요한 "
    "데이터와 계산 자원도 크게 늘어난다는 점을 기억해야 합니다. 정리하면 퍼셉트론은 신경망의 "
    "출발점이고, 신경망은 그 아이디어를 확장한 일반적인 틀입니다.")
JAPANESE_ANSWER = (
    "パーセプトロンは、一九五八年にローゼンブラットが提案した最も単純な人工ニューロンのモデルです。"
    "入力にそれぞれ重みを掛けて足し合わせ、その合計がしきい値を超えれば一を、超えなければゼロを"
    "出力します。そのため、直線一本で二つのグループに分けられる問題であれば、うまく解くことが"
    "できます。しかし、XORのように直線では分けられない問題には対応できないという限界があります。"
    "ニューラルネットワークは、この単位を何層にも重ねた構造で、入力層、隠れ層、出力層から成ります。"
    "隠れ層のニューロンは、シグモイドやReLUのような非線形の活性化関数を使います。非線形性が"
    "加わることで、曲線のような複雑な境界も表現できるようになります。学習の仕方も異なり、"
    "パーセプトロンは間違えた例に出会うたびに重みを少しずつ直します。多層のネットワークでは、"
    "誤差逆伝播法によって出力の誤差を各層の重みまでさかのぼって伝えます。勾配降下法は、こうして"
    "求めた勾配に沿って損失が小さくなる方向へパラメータを動かします。結果として、画像認識や翻訳、"
    "音声処理など、はるかに難しい課題を扱えるようになりました。")
CHINESE_ANSWER = (
    "感知器是罗森布拉特在一九五八年提出的最简单的人工神经元模型。它把每个输入乘以对应的权重后求和，"
    "如果总和超过阈值就输出一，否则输出零。因此，对于能用一条直线分开的两类数据，感知器可以很好地"
    "完成分类。但是像异或这样无法用直线分开的问题，单层感知器就无能为力了。神经网络把许多这样的单元"
    "按层堆叠起来，由输入层、隐藏层和输出层组成。隐藏层中的神经元通常使用 Sigmoid 或 ReLU 等非线性"
    "激活函数。加入非线性以后，网络就能够表示弯曲而复杂的决策边界。在训练方式上，感知器每遇到一个"
    "分错的样本就稍微调整一次权重。多层网络则依靠反向传播算法，把输出端的误差逐层传回到每一个权重。"
    "梯度下降法沿着这些梯度的方向移动参数，使损失不断减小。正因为如此，神经网络才能处理图像识别、"
    "机器翻译和语音处理等更困难的任务。当然，网络越深，所需要的数据和计算资源也越多。训练一个大型"
    "网络往往需要成千上万张图形处理器连续工作好几周。总之，感知器是神经网络的起点，而神经网络是在它的"
    "基础上发展出来的更通用的框架。")
ENGLISH_ANSWER = (
    "A perceptron, proposed by Frank Rosenblatt in 1958, is the simplest model of an artificial "
    "neuron. It multiplies each input by a weight, adds the products, and outputs 1 when the sum "
    "passes a threshold and 0 otherwise. That is why it separates two groups well whenever a "
    "single straight line can divide them. Problems such as XOR, which no straight line can "
    "split, are beyond it. A neural network stacks many such units in layers: an input layer, "
    "hidden layers and an output layer. Its hidden units use non-linear activations such as the "
    "sigmoid or ReLU, so the network can draw curved, intricate boundaries. Training differs too: "
    "the perceptron nudges its weights after each misclassified example, while a deep network "
    "sends the output error back through every layer with backpropagation and lets gradient "
    "descent move each parameter downhill. In short, the perceptron is where neural networks "
    "began, and a neural network is the general framework that grew from it.")
# Latin text with the accented letters and marks a CP1252 reading could mistake for UTF-8:
# French with no-break spaces before its marks, German quotes, Spanish, Vietnamese
LATIN_TEXTS = (
    "L’ÉTÉ\u00a0! «\u00a0Voilà\u00a0», dit-elle au café”… puis «\u00a0déjà\u00a0»\u00a0; naïve, "
    "œuvre, sœur, août, Noël, à 20\u00a0°C.",
    "„Der Fuß“, sagte er, »ist im Café…« Grüße aus München: Ärger, Öl, Übel, Straße – ½ Maß "
    "für 3,50\u00a0€.",
    "¿Qué año es? ¡Señor, mañana! Corazón, pingüino, último…",
    "Tiếng Việt là ngôn ngữ của người Việt, được viết bằng chữ Quốc ngữ với nhiều dấu: à, á, â, "
    "ã, è, é, ê, ô, õ, ù, ú, ý.",
)


def korean(chars: int = 450) -> str:
    """The Korean answer's first CHARS characters, none of them trailing space."""
    text = KOREAN_ANSWER[:chars]
    return text[:-1] + "다" if text.endswith(" ") else text


def mojibake_of(word: str, codec: str = "cp1252") -> str:
    """WORD's UTF-8 bytes read as CODEC, a character a byte."""
    return word.encode("utf-8").decode(codec)


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
    assert found.script_share > 0.95 and found.chars == 450 and found.byte_check_ran
    assert found.counts() == ("0 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in "
                              "the answer; no repeating tail; 0 invalid UTF-8 sequences in 450 "
                              "tokens' bytes")


# one sentence of the answer said 40 times after its start: the degenerate repetition the
# field reports (vLLM #56868), cut by max_tokens mid-sentence as it would be
LOOPED = korean(200) + " " + "신경망은 이러한 단위를 여러 층으로 쌓아 올린 구조입니다. " * 40 + "신경망은"


@pytest.mark.parametrize("content,reasoning,tokens,why", [
    (korean()[:200] + "\ufffd" + korean()[200:], "", None, "1 U+FFFD"),
    (korean(), "생각\ufffd", None, ("1 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs "
                                   "in the reasoning")),
    (korean(), "생각\ud83d 중", None, "0 U+FFFD, 1 lone surrogates, 0 control chars, 0 mojibake "
                                    "runs in the reasoning"),
    (korean(), "", [*utf8_tokens(korean()[:9]), [0xEA], *utf8_tokens(korean()[9:])],
     "1 invalid UTF-8 sequences in 451 tokens' bytes (first at token 9"),
    # one word of UTF-8 read as CP1252 (한국 -> í•œêµ­) or as Latin-1 inside clean Korean
    (korean(200) + " " + mojibake_of("한국") + " " + korean()[200:], "", None,
     "0 U+FFFD, 0 lone surrogates, 0 control chars, 1 mojibake runs in the answer"),
    (korean(200) + " " + mojibake_of("한국", "latin-1") + " " + korean()[200:], "", None,
     "0 U+FFFD, 0 lone surrogates, 2 control chars, 1 mojibake runs in the answer"),
    (korean(300) + mojibake_of("🎂") + korean()[300:], "", None, "1 mojibake runs"),
    (LOOPED, "", None, "the answer ends repeating "),
    (korean(), LOOPED, None, "; the reasoning ends repeating "),
    # a fault is a fault in a short or off-language answer too
    ("Short answer \ud800", "", None, "1 lone surrogates"),
])
def test_any_fault_fails_the_run(content, reasoning, tokens, why):
    found = judge(KOREAN, content, reasoning, tokens, "stop")
    assert found.verdict == "fault" and why in found.why, found.why


def test_a_looped_answer_says_its_unit_and_copies():
    found = judge(KOREAN, LOOPED, "", utf8_tokens(LOOPED), "length")
    # the loop was cut mid-sentence: the unit that ends the text starts after its first word
    assert found.verdict == "fault" and found.answer_repeat.copies == 40
    assert ("the answer ends repeating ' 이러한 단위를 여러 층으로 쌓아 올린 구조입니다. 신경망은' 40 "
            "times (1325 chars)") in found.why, found.why
    assert found.to_json()["answer_repeat"]["copies"] == 40


@pytest.mark.parametrize("text", [KOREAN_ANSWER, JAPANESE_ANSWER, CHINESE_ANSWER, ENGLISH_ANSWER],
                         ids=["ko", "ja", "zh", "en"])
def test_normal_long_answers_have_no_fault_and_no_loop(text):
    assert len(text) >= 400
    assert integrity.text_faults(text).total == 0 and integrity.mojibake(text) == []
    assert integrity.repeating_tail(text) is None


@pytest.mark.parametrize("text", LATIN_TEXTS, ids=["fr", "de", "es", "vi"])
def test_latin_text_with_accents_and_marks_is_not_mojibake(text):
    assert integrity.mojibake(text) == [] and integrity.text_faults(text).total == 0


@pytest.mark.parametrize("shown,meant", [
    (mojibake_of("한국"), "한국"),
    (mojibake_of("日本語"), "日本語"),
    (mojibake_of("퍼셉트론", "latin-1"), "퍼셉트론"),   # 0x8D: a byte CP1252 leaves unassigned
    (mojibake_of("🎂"), "🎂"),                         # one character, of four bytes
    (mojibake_of("éè"), "éè"),                         # two characters of two bytes
])
def test_mojibake_is_read_back_to_what_was_meant(shown, meant):
    assert integrity.mojibake(f"앞 {shown} 뒤") == [(shown, meant)]


@pytest.mark.parametrize("text", [
    mojibake_of("é"),        # one two-byte character: "Ã©", as legit "ß“" or "É\u00a0" read
    "voilà\u00a0»",          # E0 A0 BB: one three-byte character by chance
    "café”…",                # E9 94 85: the same
])
def test_one_character_of_two_or_three_bytes_is_not_enough(text):
    assert integrity.mojibake(text) == []


@pytest.mark.parametrize("language,content,why", [
    (KOREAN, "", "empty answer (finish_reason stop)"),
    (KOREAN, korean(399), "answer of 399 chars, under 400"),
    (KOREAN, ENGLISH_ANSWER, "off-language: 0% of its letters in Hangul, under 60%"),
    (KOREAN, " ".join(str(n) for n in range(1000, 1100)),
     "off-language: no letters at all (digits, punctuation or symbols only)"),
    # Chinese: kanji without kana
    (JAPANESE, CHINESE_ANSWER, "not Japanese: kana 0% of its letters, under 20%"),
    (KOREAN_WITH_EMOJI, korean(440) + " 🎂 🎈 🎁 🌊", "4 emoji, under 5"),
])
def test_an_unusable_answer_is_inconclusive_never_clean(language, content, why):
    found = judge(language, content, "", utf8_tokens(content), "stop")
    assert found.verdict == "inconclusive" and found.why == why, found.why


def mixed_script(hangul: int, latin: int) -> str:
    """Five words of HANGUL syllables then LATIN letters each, taken in order from the Korean
    and English answers (so nothing repeats)."""
    syllables = [c for c in KOREAN_ANSWER if "가" <= c <= "힣"]
    letters = [c for c in ENGLISH_ANSWER if c.isalpha()]
    return " ".join("".join(syllables[i * hangul:(i + 1) * hangul])
                    + "".join(letters[i * latin:(i + 1) * latin]) for i in range(5))


def clean_verdict(language, text: str, finish_reason: str = "stop") -> str:
    return judge(language, text, "", utf8_tokens(text), finish_reason).verdict


def test_the_thresholds_hold_at_their_edges():
    assert clean_verdict(KOREAN, korean(400), "length") == "clean"
    # 60 Hangul and 40 Latin letters: 60% of the letters
    assert clean_verdict(KOREAN, mixed_script(60, 40)) == "clean"
    assert clean_verdict(KOREAN, mixed_script(59, 41)) == "inconclusive"
    assert clean_verdict(JAPANESE, JAPANESE_ANSWER) == "clean"
    emoji = korean(440) + " 🎂 🎈 🎁 🌊 🍊"
    assert clean_verdict(KOREAN_WITH_EMOJI, emoji) == "clean"


def test_without_token_bytes_the_byte_check_is_not_run_and_the_run_is_not_clean():
    """A verdict needs every planned check: an answer clean in every other way, whose
    server gave no token bytes, is inconclusive, and its counts say the check did not run."""
    found = judge(KOREAN, korean(), "", None, "stop")
    assert found.token_bytes is None and not found.byte_check_ran
    assert (found.verdict, found.why) == ("inconclusive", integrity.BYTE_CHECK_NOT_RUN)
    assert found.counts().endswith("; token byte check not run: no token bytes given")
    assert found.to_json()["byte_check"] == "not run"
    # what the text shows is judged all the same: a fault without bytes is a fault
    faulty = judge(KOREAN, korean() + "\ufffd", "", None, "stop")
    assert faulty.verdict == "fault" and "token byte check not run" in faulty.why


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
