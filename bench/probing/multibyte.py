"""The multibyte probe: eleven Korean, Japanese and emoji answers of 400+ characters, sent
together, each judged whole by recipekit/text_integrity.py (docs/probes.md)."""

from __future__ import annotations

import asyncio

from bench.probing.client import Answer, Target, complete, probe_request
from bench.probing.verdict import ProbeError, ProbeResult, excerpt, status_of
from recipekit import text_integrity as integrity

# (name, language, prompt, runs). The field's prompt runs three times, as the field ran it;
# the emoji prompts ask Korean prose with a four-byte emoji per sentence, so 3-byte and
# 4-byte sequences meet in one answer.
_EMOJI_ASK = "모든 문장 끝에 어울리는 이모지를 하나씩 넣어 주세요 (예: {}). 최소 400자 이상으로 작성하세요."
MULTIBYTE_RUNS = (
    ("ko-field", integrity.KOREAN, integrity.FIELD_PROMPT, 3),
    ("ko-kimchi", integrity.KOREAN, "한국어로 김치를 담그는 과정을 재료 준비부터 숙성까지 자세히 "
                                    "설명해 주세요. 최소 400자 이상으로 작성하세요.", 1),
    ("ko-hangul", integrity.KOREAN, "한국어로 세종대왕이 한글을 만든 배경과 그 의의를 자세히 설명해 "
                                    "주세요. 최소 400자 이상으로 작성하세요.", 1),
    ("ja-perceptron", integrity.JAPANESE, "日本語で、パーセプトロンとニューラルネットワークの違いを"
                                          "詳しく説明してください。400文字以上で書いてください。", 1),
    ("ja-miso", integrity.JAPANESE, "日本語で、味噌汁の作り方を材料の準備から仕上げまで詳しく"
                                    "説明してください。400文字以上で書いてください。", 1),
    ("ja-kyoto", integrity.JAPANESE, "日本語で、桜の季節に京都を一日で巡る旅の計画を詳しく"
                                     "書いてください。400文字以上で書いてください。", 1),
    ("emoji-jeju", integrity.KOREAN_WITH_EMOJI,
     "한국어로 제주도 여행 일기를 써 주세요. " + _EMOJI_ASK.format("🌊 🍊 🐴"), 1),
    ("emoji-dog", integrity.KOREAN_WITH_EMOJI,
     "한국어로 반려견과 보낸 주말 이야기를 써 주세요. " + _EMOJI_ASK.format("🐶 🦴 🌳"), 1),
    ("emoji-party", integrity.KOREAN_WITH_EMOJI,
     "한국어로 생일 파티를 준비하는 과정을 써 주세요. " + _EMOJI_ASK.format("🎂 🎈 🎁"), 1),
)
MULTIBYTE_MAX_TOKENS = integrity.FIELD_MAX_TOKENS   # the field's, for every run


async def _multibyte_answer(target: Target, prompt: str) -> tuple[Answer, str | None]:
    """One greedy answer with its token bytes; (answer, note). A server that refuses logprobs
    (HTTP 400) is asked again without them, so that what the text shows is still judged; the
    note says the bytes went unchecked (the run is then at best inconclusive)."""
    messages = [{"role": "user", "content": prompt}]
    try:
        return await complete(target.session, target.url, probe_request(
            target.model, messages, MULTIBYTE_MAX_TOKENS, logprobs=True)), None
    except ProbeError as error:
        if not str(error).startswith("HTTP 400"):
            raise
        refused = str(error)
    answer = await complete(target.session, target.url, probe_request(
        target.model, messages, MULTIBYTE_MAX_TOKENS))
    return answer, f"logprobs refused ({refused}): token bytes unchecked"


async def _multibyte_run(target: Target, name: str, language: integrity.Language,
                         prompt: str) -> dict:
    try:
        answer, note = await _multibyte_answer(target, prompt)
    except ProbeError as failed:
        return {"name": name, "language": language.name, "verdict": "inconclusive",
                "why": f"no answer: {failed}", "note": None}
    judged = integrity.judge(language, answer.content, answer.reasoning, answer.token_bytes,
                             answer.finish_reason)
    return {"name": name, **judged.to_json(), "finish_reason": answer.finish_reason,
            "completion_tokens": answer.usage.get("completion_tokens"),
            "counts": judged.counts(), "shape": judged.shape(), "note": note,
            "content": excerpt(answer.content)}


def multibyte_line(run: dict) -> str:
    """One run as the result says it: name, verdict, counts, length and script share."""
    if "counts" not in run:
        return f"{run['name']}: {run['verdict']} ({run['why']})"
    why = "" if run["verdict"] != "inconclusive" else f" ({run['why']})"
    return f"{run['name']}: {run['verdict']}{why}: {run['counts']}; {run['shape']}"


async def probe_multibyte(target: Target) -> ProbeResult:
    # sent together: a server batches them (MAX_NUM_SEQS at a time), and greedy runs need
    # no order; each is judged alone
    runs = await asyncio.gather(*(_multibyte_run(target, name, language, prompt)
                                  for name, language, prompt, count in MULTIBYTE_RUNS
                                  for _ in range(count)))
    for index, run in enumerate(runs):
        run["run"] = index + 1
    verdicts = [run["verdict"] for run in runs]
    faults = [run for run in runs if run["verdict"] == "fault"]
    # the answered runs whose token bytes did not come: their byte check did not run
    unchecked = [run["run"] for run in runs if run.get("byte_check") == "not run"]
    details = {"runs": runs, "max_tokens": MULTIBYTE_MAX_TOKENS,
               "min_chars": integrity.MIN_ANSWER_CHARS,
               "min_script_share": integrity.MIN_SCRIPT_SHARE,
               "replacement": [run.get("answer_faults", {}).get("replacement") for run in runs],
               "clean": verdicts.count("clean"), "fault": len(faults),
               "inconclusive": verdicts.count("inconclusive"), "byte_check_not_run": unchecked}
    tally = (f"{verdicts.count('clean')} clean, {len(faults)} faulty, "
             f"{verdicts.count('inconclusive')} inconclusive of {len(runs)} runs")
    if unchecked:
        tally += (f"; token byte check not run on run(s) {', '.join(map(str, unchecked))} "
                  f"(no token bytes given)")
    status = status_of(faulty=bool(faults), unjudged="inconclusive" in verdicts)
    if status == "fail":
        by_run = ", ".join("-" if run.get("answer_faults") is None else
                           str(run["answer_faults"]["replacement"]) for run in runs)
        return ProbeResult("multibyte", status, f"{tally}; U+FFFD in the answer by run: "
                                                f"{by_run}; first: run {faults[0]['run']} "
                                                f"{multibyte_line(faults[0])}", details=details)
    if status == "inconclusive":
        unclear = [run for run in runs if run["verdict"] == "inconclusive"]
        return ProbeResult("multibyte", status, f"{tally}; " + "; ".join(
            multibyte_line(run) for run in unclear[:3]), details=details)
    return ProbeResult("multibyte", status, f"{tally}: no U+FFFD, lone surrogate, control "
                                            f"character, mojibake, repeating tail or invalid "
                                            f"token byte, every run's token bytes checked",
                       details=details)
