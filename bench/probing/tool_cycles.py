"""The tool_cycles probe: streamed multi-turn tool calls with Korean, Japanese and emoji
arguments; the call's JSON parses, its arguments round-trip, every text of the cycle (the
content beside a call, the answer after the result, the reasoning, the arguments) is whole,
none holds tool markup or ends repeating, and the answer uses the tool's result
(docs/probes.md)."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

from bench.probing.client import Target
from bench.probing.verdict import ProbeError, ProbeResult, excerpt
from bench.stream_client import chat_request, stream_text
from recipekit import text_integrity as integrity

CYCLE_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city, as the user names it"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "save_note", "description": "Save a note with a title and a body.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "body": {"type": "string"}},
            "required": ["title", "body"]}}},
]


@dataclass(frozen=True)
class Cycle:
    """One user turn that must come back as a call of `tool` with exactly `arguments`, then
    an answer, once `result` is sent back, that quotes the result's `uses` value."""

    name: str
    ask: str
    tool: str
    arguments: dict
    result: dict
    uses: str                          # the key of result whose value the answer must quote

    @property
    def expected(self) -> str:
        return str(self.result[self.uses])


def _pinned(text: str, tool: str, arguments: dict) -> str:
    return text.format(tool=tool, arguments=json.dumps(arguments, ensure_ascii=False))


def quotes(answer: str, value: str) -> bool:
    """Whether ANSWER holds VALUE, a number, whole: not inside a longer number, full-width
    digits read as digits (NFKC), so a Korean "21도" and a Japanese "２１度" both quote 21."""
    text = unicodedata.normalize("NFKC", answer)
    return re.search(rf"(?<!\d){re.escape(value)}(?!\d)", text) is not None


# two conversations of two cycles each: a city's temperature, then a note with emoji whose
# number the tool gives, in Korean and Japanese. The answer must quote the number the tool
# returned: a number no model can know before the result, of two or three digits (written
# in digits in every language here, and with no thousands separator in any locale); "OK." or
# an answer that ignores the tool does not hold it.
CONVERSATIONS = (
    ("ko", (
        Cycle("ko-weather", _pinned("서울의 지금 기온을 알려 주세요. {tool} 도구를 다음 인자 그대로 "
                                    "호출하세요: {arguments}", "get_weather",
                                    {"city": "서울특별시"}),
              "get_weather", {"city": "서울특별시"},
              {"city": "서울특별시", "temperature_c": 21, "condition": "맑음 ☀️"}, "temperature_c"),
        Cycle("ko-note", _pinned("고마워요. 이제 {tool} 도구를 다음 인자 그대로 호출해 메모를 "
                                 "저장하고, 저장된 메모 번호를 알려 주세요: {arguments}", "save_note",
                                 {"title": "서울 날씨 메모 🌤️", "body": "우산은 두고 가도 돼요 😊"}),
              "save_note", {"title": "서울 날씨 메모 🌤️", "body": "우산은 두고 가도 돼요 😊"},
              {"saved": True, "note_id": 482}, "note_id"),
    )),
    ("ja", (
        Cycle("ja-weather", _pinned("京都の今の気温を教えてください。{tool} ツールを次の引数のまま"
                                    "呼んでください: {arguments}", "get_weather",
                                    {"city": "京都市"}),
              "get_weather", {"city": "京都市"},
              {"city": "京都市", "temperature_c": 17, "condition": "小雨 🌧️"}, "temperature_c"),
        Cycle("ja-note", _pinned("ありがとう。次に {tool} ツールを次の引数のまま呼んでメモを保存し、"
                                 "保存したメモの番号を教えてください: {arguments}", "save_note",
                                 {"title": "京都の天気 🌸", "body": "傘を持っていくこと ☂️"}),
              "save_note", {"title": "京都の天気 🌸", "body": "傘を持っていくこと ☂️"},
              {"saved": True, "note_id": 736}, "note_id"),
    )),
)
CYCLE_MAX_TOKENS = 384
# after a tool result the model may call again; a call beyond these is a loop
CYCLE_MAX_EXTRA_CALLS = 2
CYCLE_EXTRA_RESULT = {"ok": True}


@dataclass
class Turn:
    """One streamed response of a cycle, judged."""

    content: str
    calls: list[dict]                  # assembled: id, name, arguments (string), parsed
    finish_reason: str | None
    problems: list[str]
    leaks: int = 0                     # texts holding tool markup
    repeats: int = 0                   # texts ending in a repeating tail
    faulty: int = 0                    # texts with a fault (U+FFFD, surrogate, control, mojibake)


async def _cycle_turn(target: Target, messages: list[dict], label: str) -> Turn:
    body = chat_request(target.model, messages, CYCLE_MAX_TOKENS, ignore_eos=False)
    body.update(tools=CYCLE_TOOLS, tool_choice="auto")
    reply = await stream_text(target.session, target.url, body)
    if not reply.delivered:
        raise ProbeError(f"{label}: {reply.record.failure}: {reply.record.detail}")
    problems, calls = [], []
    for call in reply.tool_calls:
        function = call["function"]
        entry = {"id": call["id"], "name": function["name"], "arguments": function["arguments"],
                 "parsed": None}
        try:
            entry["parsed"] = json.loads(function["arguments"] or "{}")
        except ValueError:
            problems.append(f"{label}: {function['name'] or '(no name)'} arguments are not "
                            f"JSON: {excerpt(function['arguments'])!r}")
        else:
            if not isinstance(entry["parsed"], dict):
                problems.append(f"{label}: {function['name']} arguments are not a JSON object: "
                                f"{excerpt(function['arguments'])!r}")
        calls.append(entry)
    turn = Turn(reply.content, calls, reply.record.finish_reason, problems)
    # every text of the turn: the content (beside a call, or the answer), the reasoning, and
    # each call's arguments as streamed
    for where, text in (("content", reply.content), ("reasoning", reply.reasoning),
                        *(("arguments", c["arguments"]) for c in calls)):
        if (faults := integrity.text_faults(text)).total:
            turn.faulty += 1
            problems.append(f"{label}: {faults.phrase(where)}: {excerpt(text)!r}")
        if tags := integrity.leaked_markup(text):
            turn.leaks += 1
            problems.append(f"{label}: tool markup {' '.join(tags)} in the {where}: "
                            f"{excerpt(text)!r}")
    for where, text in (("content", reply.content), ("reasoning", reply.reasoning)):
        if loop := integrity.repeating_tail(text):
            turn.repeats += 1
            problems.append(f"{label}: the {where} ends repeating {loop.unit!r} {loop.copies} "
                            f"times ({loop.chars} chars)")
    return turn


def _assistant_message(turn: Turn) -> dict:
    return {"role": "assistant", "content": turn.content or None,
            "tool_calls": [{"id": call["id"], "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]}}
                           for call in turn.calls]}


def _tool_messages(turn: Turn, result: dict) -> list[dict]:
    return [{"role": "tool", "tool_call_id": call["id"],
             "content": json.dumps(result, ensure_ascii=False)} for call in turn.calls]


async def _run_cycle(target: Target, messages: list[dict], cycle: Cycle) -> dict:
    """The call turn and the turns after its result; appends them to messages."""
    messages.append({"role": "user", "content": cycle.ask})
    record: dict = {"name": cycle.name, "tool": cycle.tool, "asked": cycle.arguments,
                    "calls": [], "round_trip": False, "answer": None, "expects": cycle.expected,
                    "used_result": False, "problems": [], "markup_leaks": 0,
                    "repeating_tails": 0, "text_faults": 0}

    def judged(turn: Turn) -> Turn:
        record["problems"] += turn.problems
        record["markup_leaks"] += turn.leaks
        record["repeating_tails"] += turn.repeats
        record["text_faults"] += turn.faulty
        return turn

    turn = judged(await _cycle_turn(target, messages, f"{cycle.name} call"))
    record["calls"] += turn.calls
    asked = [call for call in turn.calls if call["name"] == cycle.tool]
    if not asked:
        record["problems"].append(
            f"{cycle.name}: no {cycle.tool} call (tool calls {[c['name'] for c in turn.calls]}, "
            f"finish_reason {turn.finish_reason}); content: {excerpt(turn.content)!r}")
        return record
    got = asked[0]["parsed"]
    if isinstance(got, dict):
        wrong = {key: got.get(key) for key, value in cycle.arguments.items()
                 if got.get(key) != value}
        record["round_trip"] = not wrong
        if wrong:
            record["problems"].append(
                f"{cycle.name}: {cycle.tool} arguments came back "
                f"{json.dumps(got, ensure_ascii=False)}, asked "
                f"{json.dumps(cycle.arguments, ensure_ascii=False)}")
    messages.append(_assistant_message(turn))
    messages += _tool_messages(turn, cycle.result)
    for extra in range(CYCLE_MAX_EXTRA_CALLS + 1):
        turn = judged(await _cycle_turn(target, messages, f"{cycle.name} answer {extra + 1}"))
        if not turn.calls:
            record["answer"] = excerpt(turn.content)
            record["used_result"] = quotes(turn.content, cycle.expected)
            if not turn.content.strip():
                record["problems"].append(f"{cycle.name}: empty answer after the tool result "
                                          f"(finish_reason {turn.finish_reason})")
            elif not record["used_result"]:
                record["problems"].append(
                    f"{cycle.name}: the answer does not use the tool result (no {cycle.expected}, "
                    f"its {cycle.uses}): {excerpt(turn.content)!r}")
            messages.append({"role": "assistant", "content": turn.content})
            return record
        record["calls"] += turn.calls
        messages.append(_assistant_message(turn))
        messages += _tool_messages(turn, CYCLE_EXTRA_RESULT)
    record["problems"].append(f"{cycle.name}: still calling tools after "
                              f"{CYCLE_MAX_EXTRA_CALLS} extra calls, no answer")
    return record


async def probe_tool_cycles(target: Target) -> ProbeResult:
    cycles = []
    for _, conversation in CONVERSATIONS:
        messages: list[dict] = []
        for cycle in conversation:
            record = await _run_cycle(target, messages, cycle)
            cycles.append(record)
            if record["problems"]:
                break   # the rest of this conversation would build on a broken turn
    calls = [call for record in cycles for call in record["calls"]]
    parsed = sum(isinstance(call["parsed"], dict) for call in calls)
    problems = [problem for record in cycles for problem in record["problems"]]
    total = sum(len(conversation) for _, conversation in CONVERSATIONS)
    clean = sum(not record["problems"] for record in cycles)
    details = {"cycles": cycles, "asked_cycles": total, "clean_cycles": clean,
               "calls": len(calls), "calls_parsed": parsed,
               "round_trips": sum(record["round_trip"] for record in cycles),
               "markup_leaks": sum(record["markup_leaks"] for record in cycles),
               "repeating_tails": sum(record["repeating_tails"] for record in cycles),
               "text_faults": sum(record["text_faults"] for record in cycles),
               "results_used": sum(record["used_result"] for record in cycles)}
    tally = (f"{clean} of {total} cycles clean; {parsed} of {len(calls)} calls' JSON parsed, "
             f"{details['round_trips']} round-tripped, {details['text_faults']} faulty text(s), "
             f"{details['markup_leaks']} markup leak(s), {details['repeating_tails']} repeating "
             f"tail(s), {details['results_used']} of {total} answers used the tool result")
    if problems:
        return ProbeResult("tool_cycles", "fail", f"{tally}: " + "; ".join(problems[:3]),
                           details=details)
    return ProbeResult("tool_cycles", "pass", tally, details=details)
