"""Tool calls in each model family's own syntax, through the official openai client.

Environment: STRATA_SERVERS, a comma-separated list of SYNTAX=URL (SYNTAX as strata names it:
hermes, mistral-args, granite, ...), each a `strata serve` of a model whose template writes that
syntax. The token log-probabilities show the text the model was made to write, so each check sees
both the parsed calls and the family's markers around them.
Prints one line per check and ends with "N passed, M failed".
"""
import json
import os

import jsonschema
from harness import attempt, report
import openai

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -99, "maximum": 99},
            "b": {"type": "integer", "minimum": -99, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# How the answer's text begins, and what must appear in it, per syntax.
MARKERS = {
    "hermes": ("<tool_call>", ["</tool_call>", "\"arguments\": "]),
    "mistral-args": ("[TOOL_CALLS]", ["[ARGS]"]),
    "mistral-list": ("[TOOL_CALLS]", ["[{\"name\": ", "\"id\": "]),
    "granite": ("<|tool_call|>", ["[{\"name\": "]),
    "llama3": ("{\"name\": ", ["\"parameters\": "]),
    "harmony": ("<|channel|>", ["commentary to=functions.", "<|constrain|>json<|message|>"]),
}
USER = [{"role": "user", "content": "What is the weather in Oslo, and what is 2 + 3?"}]


def validate(msg, only=None):
    assert msg.tool_calls, msg
    for call in msg.tool_calls:
        assert call.type == "function" and call.id
        assert call.function.name in SCHEMAS, call
        if only:
            assert call.function.name == only, call
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def checks_for(syntax, url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    start, inside = MARKERS[syntax]

    def written(r):
        return "".join(t.token for t in r.choices[0].logprobs.content)

    def required_calls_are_written_in_the_familys_syntax():
        r = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=120, temperature=0,
                                           logprobs=True)
        assert r.choices[0].finish_reason == "tool_calls", r
        validate(r.choices[0].message)
        assert len(r.choices[0].message.tool_calls) == 1
        text = written(r)
        assert text.startswith(start), text
        for piece in inside:
            assert piece in text, (piece, text)
        if syntax == "harmony":
            # Harmony's structure tokens are single tokens, and nothing of them reaches the
            # content.
            assert r.choices[0].logprobs.content[0].token == "<|channel|>", text
            assert not r.choices[0].message.content, r
        if syntax == "mistral-args":
            # The marker is Mistral's control token (the synthetic model has it), one token,
            # not text spelling it.
            assert r.choices[0].logprobs.content[0].token == "[TOOL_CALLS]", text

    def parallel_calls_are_each_valid():
        # Random weights may keep calling until the budget ends; every call given out is whole.
        r = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, temperature=0, logprobs=True)
        assert r.choices[0].finish_reason in ("tool_calls", "length"), r
        validate(r.choices[0].message)

    def a_named_call_streams_as_it_comes_whole():
        args = dict(model=model, messages=USER, tools=TOOLS, max_tokens=80, temperature=0,
                    tool_choice={"type": "function", "function": {"name": "add"}})
        whole = client.chat.completions.create(**args)
        validate(whole.choices[0].message, only="add")
        name, parts, finish = None, [], None
        for ch in client.chat.completions.create(stream=True, **args):
            if not ch.choices:
                continue
            for d in ch.choices[0].delta.tool_calls or []:
                if d.function and d.function.name:
                    name = d.function.name
                if d.function and d.function.arguments:
                    parts.append(d.function.arguments)
            finish = ch.choices[0].finish_reason or finish
        assert finish == "tool_calls" and name == "add", (finish, name)
        assert "".join(parts) == whole.choices[0].message.tool_calls[0].function.arguments

    def sampled_calls_are_always_valid():
        for seed in range(4):
            r = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="required",
                                               max_tokens=150, temperature=1.0, seed=seed)
            if r.choices[0].finish_reason == "tool_calls":
                validate(r.choices[0].message)
            else:
                # Only the budget may stop a call, and then no broken call is given out: the calls
                # finished before the cut are (each valid), the one it cut is not.
                assert r.choices[0].finish_reason == "length", r
                if r.choices[0].message.tool_calls:
                    validate(r.choices[0].message)

    def auto_calls_are_valid_and_text_stays_text():
        for seed in range(3):
            r = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="auto",
                                               max_tokens=40, temperature=1.0, seed=seed)
            m = r.choices[0].message
            if m.tool_calls:
                validate(m)
            else:
                assert start not in (m.content or ""), m

    def an_earlier_call_and_its_result_continue_the_conversation():
        msgs = USER + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_0_abcdef", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_0_abcdef", "content": "{\"temperature\": 3}"},
        ]
        r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=8, temperature=0)
        assert r.choices[0].message.content is not None or r.choices[0].message.tool_calls

    return [required_calls_are_written_in_the_familys_syntax, parallel_calls_are_each_valid,
            a_named_call_streams_as_it_comes_whole,
            sampled_calls_are_always_valid, auto_calls_are_valid_and_text_stays_text,
            an_earlier_call_and_its_result_continue_the_conversation]


report(
    attempt(f"{syntax}: {fn.__name__}", fn)
    for syntax, url in (entry.split("=", 1) for entry in os.environ["STRATA_SERVERS"].split(","))
    for fn in checks_for(syntax, url)
)
