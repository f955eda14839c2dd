"""The tool probes: a weather question must come back as a parsed tool call, and the tool's
result sent back must be used in the answer.

  tool_call          a get_weather call as a parsed tool_calls entry naming Paris
  tool_conversation  the call's result, sent back in a second turn, used in the answer
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from bench.probing.client import Answer, Target, complete, probe_request
from bench.probing.verdict import ProbeResult, excerpt

TOOL_MAX_TOKENS = 256
ANSWER_MAX_TOKENS = 128

WEATHER_QUESTION = "What is the weather like in Paris right now? Use the get_weather tool."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "the city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
WEATHER_RESULT = {"location": "Paris", "temperature_c": 23, "condition": "light drizzle"}


@dataclass
class WeatherCall:
    problem: str | None           # why this is not a good get_weather call, None when it is
    call: dict | None
    arguments: object = None


def judge_weather_call(answer: Answer) -> WeatherCall:
    if not answer.tool_calls:
        if "get_weather" in answer.content or "<tool_call>" in answer.content:
            return WeatherCall("the call came back as text in content, not as a parsed "
                               "tool_calls entry (is a tool-call parser on? vLLM: "
                               "--enable-auto-tool-choice --tool-call-parser): "
                               f"{excerpt(answer.content)!r}", None)
        return WeatherCall(f"no tool_calls entry (tool_calls {answer.tool_calls_shape}, "
                           f"finish_reason {answer.finish_reason}); content: "
                           f"{excerpt(answer.content)!r}", None)
    call = answer.tool_calls[0]
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return WeatherCall(f"tool_calls[0] has no function object: {excerpt(json.dumps(call))}",
                           None)
    if function.get("name") != "get_weather":
        return WeatherCall(f"called {function.get('name')!r}, not get_weather", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return WeatherCall(f"get_weather arguments are not JSON: "
                               f"{excerpt(function.get('arguments'))!r}", call)
    location = arguments.get("location") if isinstance(arguments, dict) else None
    if not isinstance(location, str):
        return WeatherCall(f"get_weather arguments name no location: "
                           f"{excerpt(json.dumps(arguments))}", call, arguments)
    if "paris" not in location.lower():
        return WeatherCall(f"get_weather location {location!r}, the question asked about Paris",
                           call, arguments)
    return WeatherCall(None, call, arguments)


async def _ask_weather(target: Target) -> tuple[Answer, WeatherCall]:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": WEATHER_QUESTION}], TOOL_MAX_TOKENS,
        tools=[WEATHER_TOOL], tool_choice="auto"))
    return answer, judge_weather_call(answer)


async def probe_tool_call(target: Target) -> ProbeResult:
    answer, verdict = await _ask_weather(target)
    details = {"tool_calls": answer.tool_calls, "tool_calls_shape": answer.tool_calls_shape,
               "arguments": verdict.arguments, "finish_reason": answer.finish_reason,
               "content": excerpt(answer.content)}
    if verdict.problem:
        return ProbeResult("tool_call", "fail", verdict.problem, details=details)
    return ProbeResult("tool_call", "pass", f"get_weather({json.dumps(verdict.arguments)}) as a "
                                            f"parsed tool_calls entry", details=details)


async def probe_tool_conversation(target: Target) -> ProbeResult:
    first, verdict = await _ask_weather(target)
    details: dict = {"turn1_tool_calls": first.tool_calls, "turn1_content": excerpt(first.content)}
    if verdict.problem:
        return ProbeResult("tool_conversation", "fail", f"turn 1: {verdict.problem}",
                           details=details)
    call_id = verdict.call.get("id") or "call_probe_" + secrets.token_hex(6)
    function = verdict.call["function"]
    arguments = function["arguments"] if isinstance(function["arguments"], str) \
        else json.dumps(function["arguments"])
    messages = [
        {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": first.content,
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(WEATHER_RESULT)},
    ]
    second = await complete(target.session, target.url, probe_request(
        target.model, messages, ANSWER_MAX_TOKENS, tools=[WEATHER_TOOL], tool_choice="auto"))
    temperature = str(WEATHER_RESULT["temperature_c"])
    details.update(turn2_tool_calls=second.tool_calls, turn2_content=excerpt(second.content),
                   turn2_finish_reason=second.finish_reason, tool_result=WEATHER_RESULT)
    if second.tool_calls:
        return ProbeResult("tool_conversation", "fail", "turn 2 called a tool again instead of "
                                                        "answering from the tool result: "
                                                        f"{excerpt(json.dumps(second.tool_calls))}",
                           details=details)
    if not re.search(rf"\b{temperature}\b", second.content):
        return ProbeResult("tool_conversation", "fail", f"turn 2 does not use the tool result "
                                                        f"({temperature} C, "
                                                        f"{WEATHER_RESULT['condition']}): "
                                                        f"{excerpt(second.content)!r}",
                           details=details)
    return ProbeResult("tool_conversation", "pass", f"get_weather called, its result used: "
                                                    f"{excerpt(second.content, 80)!r}",
                       details=details)
