"""Drives a running `strata serve` through the official openai client's Responses API.

Environment and report: see harness.py.
"""
import json
import os

import jsonschema
from harness import MODEL, PROMPT, URL, WEATHER_DESCRIPTION, WEATHER_PARAMETERS, check, raw, run
import openai

client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=120)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": WEATHER_DESCRIPTION,
    "parameters": WEATHER_PARAMETERS,
}


@check
def greedy_text_equals_strata_run():
    r = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=24, temperature=0)
    assert r.output_text == os.environ["STRATA_RUN_TEXT"], (r.output_text, os.environ["STRATA_RUN_TEXT"])
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL, r
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 24 and r.usage.input_tokens > 10, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


@check
def long_instructions_sent_again_are_cached_input():
    instructions = "Answer as a travel guide. " + " ".join(
        f"Tip {i}: mention one museum and one park." for i in range(60)
    )
    args = dict(model=MODEL, instructions=instructions, max_output_tokens=4, temperature=0)
    first = client.responses.create(input=PROMPT, **args)
    again = client.responses.create(input="Where should I eat?", **args)
    assert first.usage.input_tokens > 600, first.usage
    assert again.usage.input_tokens_details.cached_tokens >= 512, again.usage
    assert again.usage.input_tokens_details.cached_tokens < again.usage.input_tokens, again.usage


@check
def a_stream_has_the_documented_events_and_the_same_text():
    args = dict(model=MODEL, input=PROMPT, max_output_tokens=24, temperature=0)
    whole = client.responses.create(**args).output_text
    kinds, deltas, final = [], [], None
    for ev in client.responses.create(stream=True, **args):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert "".join(deltas) == whole and final.output_text == whole, (deltas, whole)
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds[:4]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"], kinds[-4:]
    # The SDK's own stream helper assembles an answer that completes (it wants
    # `response.completed`): a schema of one short answer.
    short = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    fmt = {"format": {"type": "json_schema", "name": "yes_no", "schema": short}}
    done = client.responses.create(model=MODEL, input="Is Paris in France?", text=fmt, temperature=0)
    assert done.status == "completed", done
    with client.responses.stream(model=MODEL, input="Is Paris in France?", text=fmt, temperature=0) as s:
        for _ in s:
            pass
        assert s.get_final_response().output_text == done.output_text


@check
def instructions_and_message_items():
    r = client.responses.create(
        model=MODEL, instructions="You are a terse geography teacher.", temperature=0, max_output_tokens=8,
        input=[{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
    )
    plain = client.responses.create(model=MODEL, input=PROMPT, temperature=0, max_output_tokens=8)
    assert r.usage.input_tokens != plain.usage.input_tokens, (r.usage, plain.usage)
    assert r.instructions == "You are a terse geography teacher.", r.instructions


@check
def function_calls_round_trip_through_previous_response_id():
    first = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=64,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and first.status == "completed", first.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_"), calls[0]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], temperature=0, max_output_tokens=16,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}],
    )
    assert second.previous_response_id == first.id and second.output, second
    assert second.usage.input_tokens > first.usage.input_tokens, (second.usage, first.usage)
    # The same call output without the earlier response is refused: no call has that id.
    try:
        client.responses.create(model=MODEL, input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}])
        raise AssertionError("an output for an unknown call was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "input[0].call_id", e.body


@check
def namespaced_tools_are_called_back_by_name_and_namespace_and_hosted_tools_left_out():
    ns = {"type": "namespace", "name": "weather_ns", "description": "Weather tools.", "tools": [WEATHER]}
    tools = [ns, {"type": "web_search", "external_web_access": False}]
    question = {"role": "user", "content": "What is the weather in Paris?"}
    raw_first = client.responses.with_raw_response.create(
        model=MODEL, input=[question], tools=tools, tool_choice={"type": "function", "name": "get_weather"},
        temperature=0, max_output_tokens=64, store=False, include=["reasoning.encrypted_content"],
        prompt_cache_key="session-1",
    )
    assert raw_first.headers.get("x-strata-ignored-tools") == "web_search", raw_first.headers
    first = raw_first.parse()
    assert first.prompt_cache_key == "session-1", first
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", first.output
    assert calls[0].namespace == "weather_ns", calls[0]
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # The call goes back as the client keeps it (with its namespace), and its output after it.
    second = client.responses.create(
        model=MODEL, tools=tools, temperature=0, max_output_tokens=8, store=False,
        input=[question, calls[0].model_dump(exclude_none=True, by_alias=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}],
    )
    assert second.status in ("completed", "incomplete") and second.output, second


@check
def streamed_function_call_arguments_join_into_the_call():
    deltas, done = [], []
    for ev in client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        temperature=0, max_output_tokens=64, stream=True,
    ):
        if ev.type == "response.function_call_arguments.delta":
            deltas.append(ev.delta)
        if ev.type == "response.output_item.done" and ev.item.type == "function_call":
            done.append(ev.item)
    assert done and "".join(deltas).startswith(done[0].arguments), (deltas, done)
    jsonschema.validate(json.loads(done[0].arguments), WEATHER["parameters"])


@check
def text_format_json_schema_is_followed():
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=MODEL, input="The largest city of France, as JSON.", temperature=0, max_output_tokens=96,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), schema)


@check
def stored_responses_can_be_read_and_deleted_and_store_false_keeps_none():
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text, (got, r)
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("a deleted response was returned")
    except openai.NotFoundError:
        pass
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    try:
        client.responses.retrieve(unstored.id)
        raise AssertionError("a store=false response was stored")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=unstored.id)
        raise AssertionError("continued a response that was not stored")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body


@check
def errors_name_the_field():
    cases = [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
         "tool_choice"),
        ({"model": MODEL, "input": "x", "include": ["reasoning.encrypted_content", "nope"]}, "include[1]"),
        ({"model": MODEL, "input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"model": MODEL, "input": "x", "background": True}, "background"),
    ]
    for body, param in cases:
        status, text = raw("POST", "/v1/responses", body)
        assert status == 400, (body, status, text)
        assert json.loads(text)["error"]["param"] == param, (param, text)
    status, text = raw("POST", "/v1/responses", {"model": "nope", "input": "x"})
    assert status == 404, text
    status, _ = raw("GET", "/v1/responses/resp_nope")
    assert status == 404


@check
def keys_are_required():
    keyed = os.environ["STRATA_KEYED_URL"]
    status, _ = raw("POST", "/v1/responses", {"model": MODEL, "input": "x"}, base=keyed)
    assert status == 401
    good = openai.OpenAI(base_url=keyed + "/v1", api_key=os.environ["STRATA_KEY"], max_retries=0)
    assert good.responses.create(model=MODEL, input="Hi", max_output_tokens=2).usage.output_tokens >= 1


run()
