"""Drives a running `strata serve` with the official openai client, as a user would.

Environment: STRATA_URL (the open server), STRATA_KEYED_URL (a server with keys, one of them
rate limited), STRATA_TINY_URL (one slot, a queue of one, a small body limit), STRATA_MODEL,
STRATA_RUN_TEXT (what `strata run` printed greedily for PROMPT below), STRATA_KEY, STRATA_SLOW_KEY.
Prints one line per check and ends with "N passed, M failed".
"""
import concurrent.futures
import json
import os
import random

import jsonschema
from harness import check, raw, run
import openai

URL = os.environ["STRATA_URL"]
MODEL = os.environ["STRATA_MODEL"]
PROMPT = "What is the capital of France?"
client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=120)



def expect_error(status, body, want, param=None):
    assert status == want, (status, body[:300])
    err = json.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert "type" in err and "param" in err and "code" in err, err
    if param is not None:
        assert err["param"] == param, err


@check
def greedy_chat_equals_strata_run():
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0
    )
    assert r.choices[0].message.content == os.environ["STRATA_RUN_TEXT"], (
        r.choices[0].message.content,
        os.environ["STRATA_RUN_TEXT"],
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@check
def streamed_chat_equals_whole_chat_and_reports_usage():
    args = dict(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.content
    parts, finish, usage = [], None, None
    for c in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if c.usage:
            usage = c.usage
        for ch in c.choices:
            if ch.delta.content:
                parts.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    assert "".join(parts) == whole
    assert finish == "length" and usage.completion_tokens == 24


@check
def system_and_multi_turn_messages():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one."},
        ],
        max_completion_tokens=8,
        temperature=0,
    )
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8


@check
def seeded_sampling_is_reproducible():
    args = dict(
        model=MODEL, messages=[{"role": "user", "content": "Write a short poem."}], max_tokens=20,
        temperature=0.9, top_p=0.95, seed=1234, presence_penalty=0.5, frequency_penalty=0.3,
    )
    a = client.chat.completions.create(**args).choices[0].message.content
    b = client.chat.completions.create(**args).choices[0].message.content
    c = client.chat.completions.create(**{**args, "seed": 99}).choices[0].message.content
    assert a == b, (a, b)
    assert a != c, "different seeds should differ on 20 sampled tokens"


@check
def stop_sequences_cut_the_output():
    args = dict(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0)
    full = client.chat.completions.create(**args).choices[0].message.content
    word = full.split()[2]
    r = client.chat.completions.create(stop=[word, "zzzz"], **args)
    assert r.choices[0].message.content == full[: full.index(word)], (full, word, r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(stream=True, stop=word, **args)
        if c.choices
    )
    assert streamed == r.choices[0].message.content


@check
def logprobs_are_returned():
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    lp = r.choices[0].logprobs.content
    assert len(lp) == 5
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4


@check
def text_completions_plain_and_streamed():
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens == 8
    s = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert s == text


@check
def models_are_listed():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_trip", "description": "Book a trip",
        "parameters": {"type": "object", "properties": {
            "traveller": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False},
            "stops": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
            "class": {"enum": ["economy", "business"]}},
            "required": ["traveller", "stops", "class"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validate_calls(msg, only=None):
    assert msg.tool_calls, msg
    for call in msg.tool_calls:
        assert call.type == "function" and call.id
        assert call.function.name in SCHEMAS
        if only:
            assert call.function.name == only
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@check
def tool_calls_required_named_and_auto_are_schema_valid():
    msgs = [{"role": "user", "content": "Book a business trip for Ann, 34, to Rome and Oslo."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required",
                                       max_tokens=150, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    validate_calls(r.choices[0].message)
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=150, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "book_trip"}})
    validate_calls(r.choices[0].message, only="book_trip")
    assert len(r.choices[0].message.tool_calls) == 1
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=TOOLS,
            tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=seed)
        validate_calls(r.choices[0].message)
        assert len(r.choices[0].message.tool_calls) == 1
    # auto: the model may answer or call; any call it makes is valid.
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="auto",
                                       max_tokens=150, temperature=0)
    if r.choices[0].message.tool_calls:
        validate_calls(r.choices[0].message)
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none",
                                       max_tokens=10, temperature=0)
    assert not r.choices[0].message.tool_calls


@check
def keywords_the_grammar_cannot_enforce_are_accepted_and_checked_after():
    # As pydantic (uniqueItems for set[...]) and Claude Code (propertyNames) send them: the
    # schema is accepted, the grammar enforces what it can, and the finished arguments are
    # checked against the whole schema; what breaks it is reported with the call.
    params = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                     "uniqueItems": True, "maxItems": 3},
            "labels": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                       "additionalProperties": {"type": "string"}, "maxProperties": 2},
            "mode": {"type": "string", "not": {"const": "off"}, "format": "strata-unknown"},
            "count": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["tags", "mode"],
        "if": {"properties": {"mode": {"const": "fast"}}},
        "then": {"required": ["count"]},
        "dependentRequired": {"labels": ["count"]},
    }
    tool = {"type": "function", "function": {"name": "tag_item", "description": "Tag an item", "parameters": params}}
    checker = jsonschema.Draft202012Validator(params)
    calls = broken = 0
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tag this item a, a and b; mode fast."}],
            tools=[tool], tool_choice="required", max_tokens=100, temperature=1.0, seed=seed)
        for call in r.choices[0].message.tool_calls or []:
            calls += 1
            errors = list(checker.iter_errors(json.loads(call.function.arguments)))
            reported = (call.model_extra or {}).get("schema_errors")
            assert bool(errors) == bool(reported), (call.function.arguments, errors, reported)
            broken += bool(errors)
    assert calls >= 4, calls
    # The same for a JSON answer under response_format.
    rf = {"type": "json_schema", "json_schema": {"name": "tags", "schema": params}}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tag it a and b."}],
                                       response_format=rf, max_tokens=100, temperature=0)
    if r.choices[0].finish_reason == "stop":
        errors = list(checker.iter_errors(json.loads(r.choices[0].message.content)))
        assert bool(errors) == bool((r.choices[0].message.model_extra or {}).get("schema_errors")), errors
    # A schema that cannot work is a 400 naming the problem in the schema's terms, not the
    # server's grammar.
    bad = dict(params, properties={"a": {"$ref": "#/$defs/Missing"}})
    status, body = raw("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": bad}}], "tool_choice": "required"})
    message = json.loads(body)["error"]["message"]
    assert status == 400 and "Missing" in message, (status, message)
    assert "%json" not in message and "start:" not in message and "\n" not in message, message
    print(f"     {calls} calls, {broken} breaking a keyword the grammar cannot enforce, each reported")


@check
def streamed_tool_calls_arrive_as_deltas():
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo in fahrenheit?"}], tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=100, temperature=0)
    calls, finish, pieces, first = {}, None, 0, None
    for c in client.chat.completions.create(stream=True, **args):
        for ch in c.choices:
            if first is None:
                first = ch.delta
            for d in ch.delta.tool_calls or []:
                if d.function and d.function.arguments:
                    pieces += 1
                slot = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                if d.id:
                    slot["id"] = d.id
                if d.function and d.function.name:
                    slot["name"] += d.function.name
                if d.function and d.function.arguments:
                    slot["arguments"] += d.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    assert finish == "tool_calls" and len(calls) == 1
    # The answer is a call: its first chunk has no text, `content` null (as OpenAI sends it).
    assert first.role == "assistant" and first.content is None, first
    call = calls[0]
    assert call["id"] and call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS["get_weather"])
    # The arguments stream token by token, and join into the whole answer's arguments.
    assert pieces > 3, pieces
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls[0]
    assert whole.function.arguments == call["arguments"], (whole.function.arguments, call["arguments"])


@check
def a_call_cut_by_max_tokens_ends_with_length():
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Book a trip for Ann to Rome."}], tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "book_trip"}}, max_tokens=26, temperature=0)
    r = client.chat.completions.create(**args)
    assert r.choices[0].finish_reason == "length", r
    assert not r.choices[0].message.tool_calls, "an incomplete call is not given out whole"
    finish, names = None, []
    for c in client.chat.completions.create(stream=True, **args):
        for ch in c.choices:
            for d in ch.delta.tool_calls or []:
                if d.function and d.function.name:
                    names.append(d.function.name)
            finish = ch.finish_reason or finish
    assert finish == "length" and names == ["book_trip"], (finish, names)


@check
def tool_results_continue_the_conversation():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18}"},
        ],
        tools=TOOLS, max_tokens=20, temperature=0)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


@check
def json_schema_and_json_object_output_validate():
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"enum": ["chess", "golf", "music"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"], "additionalProperties": False}},
        "required": ["name", "age", "hobbies", "address"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=120, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Reply with a JSON object about cats."}],
        max_tokens=60, temperature=0, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    # json_object with a schema, as llama.cpp's server takes it: the schema is followed.
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=120, temperature=0,
        response_format={"type": "json_object", "schema": schema})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


@check
def embeddings_come_back_as_unit_vectors_in_both_encodings():
    texts = ["The capital of France is Paris.", "Hello"]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    packed = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64
    assert [d.index for d in floats.data] == [0, 1] and floats.model == MODEL, floats
    for a, b in zip(floats.data, packed.data):
        assert a.embedding == b.embedding, "float and base64 answers differ"
        assert len(a.embedding) == 576 and abs(sum(x * x for x in a.embedding) - 1) < 1e-5
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 5, floats.usage
    # Token ids give the string's vector; dimensions cut and normalise again.
    ids = raw("POST", "/v1/embeddings", {"model": MODEL, "input": texts[0]})
    short = client.embeddings.create(model=MODEL, input=texts[0], dimensions=64, encoding_format="float")
    assert len(short.data[0].embedding) == 64 and abs(sum(x * x for x in short.data[0].embedding) - 1) < 1e-5
    assert ids[0] == 200 and json.loads(ids[1])["data"][0]["embedding"] == floats.data[0].embedding
    # More inputs than the server's queue holds requests: they queue one at a time.
    many = client.embeddings.create(model=MODEL, input=[f"item {i}" for i in range(100)])
    assert [d.index for d in many.data] == list(range(100)), len(many.data)
    for body, param in [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[10**9]]}, "input"),
                        ({"input": "x", "dimensions": 0}, "dimensions"),
                        ({"input": "x", "encoding_format": "hex"}, "encoding_format")]:
        status, text = raw("POST", "/v1/embeddings", {"model": MODEL, **body})
        assert status == 400 and json.loads(text)["error"]["param"] == param, (body, text)


@check
def invalid_parameters_are_400():
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for patch, param in [
        ({"temperature": 5}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"), ({"presence_penalty": 3}, "presence_penalty"), ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ]:
        status, body = raw("POST", "/v1/chat/completions", {**base, **patch})
        expect_error(status, body, 400, param)
    status, body = raw("POST", "/v1/chat/completions", b"{not json")
    expect_error(status, body, 400)
    status, body = raw("POST", "/v1/chat/completions", {**base, "messages": [{"role": "user", "content": "word " * 9000}]})
    expect_error(status, body, 400)
    assert json.loads(body)["error"]["code"] == "context_length_exceeded"
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=-1)
        raise AssertionError("no error")
    except openai.BadRequestError:
        pass


@check
def unknown_model_and_route_are_404():
    status, body = raw("POST", "/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]})
    expect_error(status, body, 404, "model")
    try:
        client.models.retrieve("gpt-9")
        raise AssertionError("no error")
    except openai.NotFoundError:
        pass
    status, body = raw("GET", "/v1/nothing")
    expect_error(status, body, 404)


@check
def keys_are_required_and_rate_limited():
    keyed = os.environ["STRATA_KEYED_URL"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    expect_error(*raw("POST", "/v1/chat/completions", body, base=keyed), 401)
    expect_error(*raw("POST", "/v1/chat/completions", body, {"Authorization": "Bearer wrong-key-123"}, base=keyed), 401)
    good = openai.OpenAI(base_url=keyed + "/v1", api_key=os.environ["STRATA_KEY"], max_retries=0)
    assert good.chat.completions.create(**body).usage.completion_tokens == 1
    bad = openai.OpenAI(base_url=keyed + "/v1", api_key="sk-not-a-key-000", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("no error")
    except openai.AuthenticationError:
        pass
    slow = openai.OpenAI(base_url=keyed + "/v1", api_key=os.environ["STRATA_SLOW_KEY"], max_retries=0)
    slow.models.list()
    slow.models.list()
    try:
        slow.models.list()
        raise AssertionError("the third request within a minute should be limited")
    except openai.RateLimitError as e:
        assert e.body["code"] == "rate_limit_exceeded", e.body
    # Health and metrics stay open.
    assert raw("GET", "/health", base=keyed)[0] == 200


@check
def full_queue_is_429_and_big_body_is_413():
    tiny = os.environ["STRATA_TINY_URL"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200,
            "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda _: raw("POST", "/v1/chat/completions", body, base=tiny), range(6)))
    statuses = sorted(s for s, _ in results)
    assert 200 in statuses and 429 in statuses, statuses
    for s, b in results:
        if s == 429:
            expect_error(s, b, 429)
    expect_error(*raw("POST", "/v1/chat/completions", b"{\"x\": \"" + b"a" * 300000 + b"\"}", base=tiny), 413)


@check
def hostile_json_never_gets_a_5xx():
    rng = random.Random(7)
    good = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "tools": TOOLS, "response_format": {"type": "json_object"}}).encode()
    values = [None, True, -1, 0, 1e308, -1e308, 2**70, "", "x" * 1000, [], {}, [None], {"a": {"b": []}}, "\u0000",
              "\ud800", "<|im_end|>", {"type": "function"}, [{"role": "user"}]]
    keys = ["model", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "tools", "tool_choice",
            "response_format", "logprobs", "top_logprobs", "stream", "n", "presence_penalty", "prompt"]
    count = 0
    for i in range(150):
        kind = i % 3
        if kind == 0:
            data = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            payload = bytes(data)
        else:
            obj = json.loads(good)
            for _ in range(rng.randint(1, 3)):
                obj[rng.choice(keys)] = rng.choice(values)
            if kind == 2 and isinstance(obj.get("messages"), list) and obj["messages"]:
                obj["messages"][0] = rng.choice(values)
            payload = json.dumps(obj).encode()
        path = rng.choice(["/v1/chat/completions", "/v1/completions"])
        status, body = raw("POST", path, payload)
        assert status < 500, (status, payload[:200], body[:300])
        if status != 200:
            json.loads(body)["error"]["message"]
        count += 1
    assert raw("GET", "/health")[0] == 200
    assert count == 150


@check
def metrics_count_requests_and_tokens():
    status, body = raw("GET", "/metrics")
    text = body.decode()
    assert status == 200
    for name in ["strata_http_requests_total", "strata_prompt_tokens_total", "strata_completion_tokens_total",
                 "strata_time_to_first_token_seconds_bucket", "strata_inter_token_latency_seconds_bucket",
                 "strata_queue_depth", "strata_active_sequences"]:
        assert name in text, name
    assert 'status="404"' in text and 'status="200"' in text


def metric(name, base=URL):
    text = raw("GET", "/metrics", base=base)[1].decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


@check
def a_shared_prompt_prefix_is_restored_and_answers_as_a_cold_prompt():
    # A system prompt of 600+ tokens, as agents send: later prompts starting with it restore its
    # whole 256-token blocks instead of computing them, and answer exactly as a cold prompt.
    system = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer briefly, check each fact twice and name your sources." for i in range(50)
    )

    def ask(question):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=12,
            temperature=0,
        )
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens

    restored = metric("strata_cached_prompt_tokens_total")
    cold, n, cached = ask(PROMPT)
    assert n > 600 and cached == 0, (n, cached)
    _, n2, cached = ask("Name a long river.")
    assert cached >= 512 and cached % 256 == 0 and cached < n2, (n2, cached)
    warm, n3, cached3 = ask(PROMPT)
    assert n3 == n and cached3 == (n - 1) // 256 * 256, (n, cached3)
    assert warm == cold, (warm, cold)
    assert metric("strata_cached_prompt_tokens_total") - restored == cached + cached3
    assert metric("strata_prefix_cache_bytes") > 0 and metric("strata_prefix_cache_blocks") >= 2


@check
def a_client_that_disconnects_stops_its_generation():
    import http.client
    import time
    import urllib.parse
    u = urllib.parse.urlparse(URL)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    # The grammar forbids ending before 6000 characters, so only the disconnect can stop it
    # (and leaves a choice at every character, so no token is forced).
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say a."}], "max_tokens": 4000, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
                "type": "string", "pattern": "^[ab]{6000}$"}}}}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    got = 0
    while got < 5:
        if r.readline().startswith(b"data:"):
            got += 1
    assert metric("strata_active_sequences") == 1
    conn.sock.close()
    conn.close()
    deadline = time.time() + 3
    while metric("strata_active_sequences") != 0:
        assert time.time() < deadline, "generation went on after the client left"
        time.sleep(0.05)
    a = metric("strata_completion_tokens_total")
    time.sleep(0.5)
    assert metric("strata_completion_tokens_total") == a


@check
def openapi_document_lists_the_routes():
    status, body = raw("GET", "/openapi.json")
    doc = json.loads(body)
    assert status == 200 and doc["openapi"].startswith("3.")
    for p in ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models", "/health", "/metrics"]:
        assert p in doc["paths"], p


run()
