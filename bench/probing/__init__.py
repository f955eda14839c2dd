"""The probes of bench/probes.py, one module per family (docs/probes.md):

    verdict      a probe's result, its PASS/FAIL line and the run's verdict: the one place
    client       one chat request and the parts of its answer the probes judge
    serving      counting, needle, thinking_off: does the server serve the model's basics
    tools        tool_call, tool_conversation: a parsed call and its result used
    multibyte    Korean, Japanese and emoji answers judged whole (recipekit/text_integrity.py)
    tool_cycles  streamed multi-turn tool calls with non-ASCII arguments, every text judged
    runner       the probes in order against one server: the result document

The command is bench/probes.py; nothing here imports it.
"""
