"""Drives a running `strata serve` with the official anthropic client, as a Claude-style agent would.

Environment and report: see harness.py.
"""
import json
import os

import anthropic
import jsonschema
from harness import MODEL, PROMPT, URL, WEATHER_DESCRIPTION, WEATHER_PARAMETERS, check, raw, run

client = anthropic.Anthropic(base_url=URL, api_key="unused", max_retries=0, timeout=120)

WEATHER = {
    "name": "get_weather",
    "description": WEATHER_DESCRIPTION,
    "input_schema": WEATHER_PARAMETERS,
}
TRIP = {
    "name": "book_trip",
    "description": "Book a trip for a traveller",
    "input_schema": {
        "type": "object",
        "properties": {
            "destination": {"type": "string"},
            "traveller": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
                "required": ["name"],
            },
            "stops": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["destination", "traveller"],
    },
}

# The SDK no longer has sampling arguments (newer Claude models fix them); the API still takes
# them, as strata does, so tests that need greedy output send them in the body.
GREEDY = {"temperature": 0}



def expect_anthropic_error(status, body, want_status, want_type, words=None):
    assert status == want_status, (status, body[:300])
    v = json.loads(body)
    assert v["type"] == "error", v
    assert v["error"]["type"] == want_type, v
    assert v["error"]["message"], v
    if words:
        assert words in v["error"]["message"], v


def user(text):
    return [{"role": "user", "content": text}]


def validate_tool_uses(msg, tools):
    schemas = {t["name"]: t["input_schema"] for t in tools}
    uses = [b for b in msg.content if b.type == "tool_use"]
    for u in uses:
        assert u.name in schemas, u
        assert u.id.startswith("toolu_"), u.id
        jsonschema.validate(u.input, schemas[u.name])
    return uses


@check
def greedy_message_equals_strata_run():
    r = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=user(PROMPT))
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL, r
    assert r.id.startswith("msg_"), r.id
    assert [b.type for b in r.content] == ["text"], r.content
    assert r.content[0].text == os.environ["STRATA_RUN_TEXT"], (r.content[0].text, os.environ["STRATA_RUN_TEXT"])
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None, r
    assert r.usage.output_tokens == 24 and r.usage.input_tokens > 10, r.usage
    assert r.usage.cache_read_input_tokens == 0


@check
def a_stream_carries_the_same_text_in_the_documented_events():
    args = dict(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=user(PROMPT))
    whole = client.messages.create(**args).content[0].text
    kinds = []
    with client.messages.stream(**args) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_message()
    assert final.content[0].text == whole, (final.content[0].text, whole)
    # The raw order, as the API documents it (the SDK adds its own `text` events).
    raw_kinds = [k for k in kinds if k not in ("text",)]
    assert raw_kinds[0] == "message_start", raw_kinds
    assert raw_kinds[1:3] == ["content_block_start", "content_block_delta"] or raw_kinds[1] == "ping", raw_kinds
    assert raw_kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], raw_kinds
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 24, final


@check
def system_prompt_as_string_or_blocks_is_the_same_prompt():
    sys_text = "You are a terse geography teacher."
    a = client.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, system=sys_text, messages=user(PROMPT))
    b = client.messages.create(
        model=MODEL,
        max_tokens=12,
        extra_body=GREEDY,
        system=[{"type": "text", "text": sys_text, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    )
    assert a.content[0].text == b.content[0].text, (a.content, b.content)
    assert a.usage.input_tokens == b.usage.input_tokens


@check
def count_tokens_matches_the_prompt_a_message_uses():
    args = dict(model=MODEL, system="Be brief.", messages=user(PROMPT), tools=[WEATHER])
    n = client.messages.count_tokens(**args).input_tokens
    r = client.messages.create(max_tokens=4, extra_body=GREEDY, **args)
    # Anthropic counts prompt tokens read from the cache apart from the others.
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens and n > 20, (n, r.usage)
    # Tools are part of the prompt.
    assert client.messages.count_tokens(model=MODEL, messages=user(PROMPT)).input_tokens < n


@check
def a_repeated_long_system_prompt_is_read_from_the_cache():
    # As Claude Code sends it: the same long system prompt every turn, in blocks with
    # cache_control. Whole 256-token blocks of it are read back, counted as Anthropic counts them.
    system = [
        {"type": "text", "text": "You are an agent that edits code in a repository."},
        {
            "type": "text",
            "text": " ".join(f"Guideline {i}: keep changes small and explain each one." for i in range(60)),
            "cache_control": {"type": "ephemeral"},
        },
    ]
    args = dict(model=MODEL, max_tokens=10, extra_body=GREEDY, system=system)
    first = client.messages.create(messages=user(PROMPT), **args)
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert total > 600, first.usage
    second = client.messages.create(messages=user("And of Italy?"), **args)
    assert second.usage.cache_read_input_tokens >= 512, second.usage
    assert second.usage.cache_read_input_tokens % 256 == 0, second.usage
    # Streamed: message_start already counts the cache read.
    with client.messages.stream(messages=user(PROMPT), **args) as s:
        start = next(ev for ev in s if ev.type == "message_start")
        final = s.get_final_message()
    assert start.message.usage.cache_read_input_tokens == (total - 1) // 256 * 256, start.message.usage
    assert start.message.usage.input_tokens + start.message.usage.cache_read_input_tokens == total
    assert final.content[0].text == first.content[0].text, (final.content, first.content)


@check
def stop_sequences_end_with_stop_sequence():
    r = client.messages.create(
        model=MODEL, max_tokens=64, extra_body=GREEDY, messages=user("Count from 1 to 20, separated by commas."),
        stop_sequences=["zzz", "7"],
    )
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "7", (r.stop_reason, r.stop_sequence, r.content)
    assert "7" not in r.content[0].text, r.content


@check
def tool_choice_any_and_tool_return_schema_valid_tool_uses():
    tools = [WEATHER, TRIP]
    for choice in ({"type": "any"}, {"type": "tool", "name": "book_trip"}):
        for prompt in ("What's the weather in Paris?", "Book a trip to Rome for Ada, 36."):
            r = client.messages.create(
                model=MODEL, max_tokens=128, extra_body=GREEDY, messages=user(prompt), tools=tools, tool_choice=choice,
            )
            uses = validate_tool_uses(r, tools)
            assert uses and r.stop_reason == "tool_use", (choice, prompt, r)
            if choice["type"] == "tool":
                assert {u.name for u in uses} == {"book_trip"}, uses


@check
def a_streamed_tool_use_arrives_as_input_json_deltas():
    parts, starts = [], []
    with client.messages.stream(
        model=MODEL, max_tokens=128, extra_body=GREEDY, messages=user("Weather in Oslo?"), tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as s:
        for ev in s:
            if ev.type == "content_block_start":
                starts.append(ev.content_block)
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                parts.append(ev.delta.partial_json)
        final = s.get_final_message()
    assert starts and starts[0].type == "tool_use" and starts[0].name == "get_weather", starts
    streamed = json.loads("".join(parts))
    uses = validate_tool_uses(final, [WEATHER])
    assert len(uses) >= 1 and uses[0].input == streamed, (uses, streamed)
    assert final.stop_reason == "tool_use", final


@check
def a_tool_result_continues_the_conversation():
    tools = [WEATHER]
    first = client.messages.create(
        model=MODEL, max_tokens=64, extra_body=GREEDY, messages=user("Weather in Paris?"), tools=tools,
        tool_choice={"type": "any"},
    )
    uses = validate_tool_uses(first, tools)
    assert uses, first
    follow = [
        *user("Weather in Paris?"),
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "18 C and sunny"} for u in uses
            ],
        },
    ]
    r = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=follow, tools=tools)
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
    if r.stop_reason != "tool_use":
        assert r.content[0].type == "text" and r.content[0].text, r.content
    # A result for an id no earlier tool_use has is refused.
    follow[-1]["content"][0]["tool_use_id"] = "toolu_nope"
    try:
        client.messages.create(model=MODEL, max_tokens=8, messages=follow, tools=tools)
        raise AssertionError("an unknown tool_use_id was accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and "toolu_nope" in str(e), e


@check
def max_tokens_beyond_the_context_is_clamped_and_reported():
    r = client.messages.create(model=MODEL, max_tokens=10**6, extra_body=GREEDY, messages=user("Say hi."))
    extra = r.usage.model_extra or {}
    assert extra.get("max_tokens_requested") == 10**6, r.usage
    assert 0 < extra.get("max_tokens_applied", 0) < 10**6, r.usage


@check
def output_config_format_gives_schema_valid_json():
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.messages.create(
        model=MODEL, max_tokens=96, messages=user("The largest city of France, as JSON."), extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert r.stop_reason == "end_turn", r
    jsonschema.validate(json.loads(r.content[0].text), schema)


@check
def thinking_and_unknown_fields_are_accepted():
    r = client.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be kind."}],
        thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u-1"},
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "low"}},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert r.usage.output_tokens >= 1, r


@check
def errors_are_anthropic_error_objects():
    try:
        client.messages.create(model="claude-nope", max_tokens=4, messages=user("Hi"))
        raise AssertionError("an unknown model was served")
    except anthropic.NotFoundError as e:
        assert e.status_code == 404 and e.body["error"]["type"] == "not_found_error", e.body
    try:
        client.messages.create(model=MODEL, max_tokens=4, messages=user("Hi"), extra_body={"temperature": 1.7})
        raise AssertionError("temperature 1.7 was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error" and "temperature" in str(e), e.body
    cases = [
        ({"model": MODEL, "messages": user("Hi")}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text only"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "holo"}]}]}, "holo"),
        ({"model": MODEL, "max_tokens": 4, "messages": user("Hi"), "tools": [{"type": "bash_20250124", "name": "bash"}]}, "server tools"),
        ({"model": MODEL, "max_tokens": 4, "messages": 7}, None),
        (b"{not json", None),
    ]
    for body, words in cases:
        status, text = raw("POST", "/v1/messages", body)
        expect_anthropic_error(status, text, 400, "invalid_request_error", words)
    status, text = raw("POST", "/v1/messages", b"x" * 10, {"Content-Type": "text/plain"})
    assert status == 415 and json.loads(text)["type"] == "error", (status, text)


@check
def keys_come_as_x_api_key_or_bearer():
    keyed = os.environ["STRATA_KEYED_URL"]
    good = anthropic.Anthropic(base_url=keyed, api_key=os.environ["STRATA_KEY"], max_retries=0)
    assert good.messages.create(model=MODEL, max_tokens=2, messages=user("Hi")).usage.output_tokens >= 1
    bearer = anthropic.Anthropic(base_url=keyed, auth_token=os.environ["STRATA_KEY"], max_retries=0)
    assert bearer.messages.count_tokens(model=MODEL, messages=user("Hi")).input_tokens > 0
    bad = anthropic.Anthropic(base_url=keyed, api_key="sk-wrong-key-0000", max_retries=0)
    try:
        bad.messages.create(model=MODEL, max_tokens=2, messages=user("Hi"))
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body


@check
def hostile_bodies_never_get_a_5xx():
    bodies = [
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}]},
        {"model": MODEL, "max_tokens": 4, "messages": user("Hi"), "tools": [{"name": "t", "input_schema": {"type": "nope"}}]},
        {"model": MODEL, "max_tokens": 4, "messages": user("Hi"), "tool_choice": {"type": "tool"}},
        {"model": MODEL, "max_tokens": 4, "messages": user("Hi"), "system": [{"type": "image"}]},
        {"model": MODEL, "max_tokens": -1, "messages": user("Hi")},
        {"model": MODEL, "max_tokens": 4, "messages": []},
        {"model": MODEL, "max_tokens": 4, "messages": user("Hi"), "thinking": {"type": 3}},
        {"model": MODEL, "max_tokens": 4, "messages": user("x" * 200000)},
    ]
    for b in bodies:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            status, text = raw("POST", path, b)
            assert status < 500, (path, b, status, text[:300])
            if status >= 400:
                assert json.loads(text)["type"] == "error", text[:300]


@check
def an_alias_is_served_and_listed():
    r = client.messages.create(model="claude-sonnet-4", max_tokens=24, extra_body=GREEDY, messages=user(PROMPT))
    assert r.content[0].text == os.environ["STRATA_RUN_TEXT"], r.content
    status, body = raw("GET", "/v1/models")
    assert [m["id"] for m in json.loads(body)["data"]] == [MODEL, "claude-sonnet-4"], body
    # The SDK sends anthropic-version: the list comes in Anthropic's shape.
    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL, "claude-sonnet-4"], models
    assert all(m.type == "model" and m.display_name and m.created_at.year >= 2024 for m in models), models
    one = client.models.retrieve("claude-sonnet-4")
    assert one.id == "claude-sonnet-4" and one.type == "model", one


@check
def the_servers_sampling_default_applies_to_requests_without_one():
    # The keyed server runs with --temperature 0: a request that says nothing is greedy there.
    keyed = anthropic.Anthropic(base_url=os.environ["STRATA_KEYED_URL"], api_key=os.environ["STRATA_KEY"], max_retries=0)
    r = keyed.messages.create(model=MODEL, max_tokens=24, messages=user(PROMPT))
    assert r.content[0].text == os.environ["STRATA_RUN_TEXT"], r.content


@check
def the_root_answers_a_probe():
    status, _ = raw("HEAD", "/")
    assert status == 200, status


run()
