"""Drives a running `strata serve` with the official ollama client, as Ollama's tools would.

Environment and report: see harness.py.
"""
import json
import os

import jsonschema
from harness import MODEL, PROMPT, URL, WEATHER_DESCRIPTION, WEATHER_PARAMETERS, check, raw, run
import ollama

client = ollama.Client(host=URL, timeout=120)
GREEDY = {"temperature": 0, "num_predict": 24}

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION, "parameters": WEATHER_PARAMETERS},
}


def user(text):
    return [{"role": "user", "content": text}]


@check
def greedy_chat_equals_strata_run():
    r = client.chat(model=MODEL, messages=user(PROMPT), options=GREEDY, stream=False)
    assert r.message.role == "assistant" and r.message.content == os.environ["STRATA_RUN_TEXT"], (
        r.message.content,
        os.environ["STRATA_RUN_TEXT"],
    )
    assert r.done and r.done_reason == "length", r
    assert r.eval_count == 24 and r.prompt_eval_count > 10, r
    assert r.total_duration > 0 and r.eval_duration > 0 and r.created_at, r


@check
def a_streamed_chat_is_the_same_text_in_ndjson_lines():
    whole = client.chat(model=MODEL, messages=user(PROMPT), options=GREEDY, stream=False).message.content
    parts = list(client.chat(model=MODEL, messages=user(PROMPT), options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole
    assert all(not p.done for p in parts[:-1]) and parts[-1].done, parts[-1]
    assert parts[-1].eval_count == 24 and parts[-1].done_reason == "length", parts[-1]


@check
def the_model_answers_to_its_latest_tag_and_its_alias():
    for name in (MODEL + ":latest", "claude-sonnet-4", "claude-sonnet-4:latest"):
        r = client.chat(model=name, messages=user("Hi"), options={"num_predict": 2}, stream=False)
        assert r.eval_count == 2, (name, r)


@check
def generate_templated_raw_and_streamed():
    a = client.generate(model=MODEL, prompt=PROMPT, options=GREEDY)
    assert a.response == os.environ["STRATA_RUN_TEXT"] and a.done, (a.response, os.environ["STRATA_RUN_TEXT"])
    b = "".join(p.response for p in client.generate(model=MODEL, prompt=PROMPT, options=GREEDY, stream=True))
    assert b == a.response, (b, a.response)
    c = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 8})
    assert c.response and c.eval_count == 8 and c.prompt_eval_count < a.prompt_eval_count, c
    # An empty prompt just "loads" the model.
    d = client.generate(model=MODEL, prompt="")
    assert d.done and d.done_reason == "load", d


@check
def options_stop_seed_and_system():
    r = client.chat(
        model=MODEL, messages=user("Count from 1 to 20, separated by commas."),
        options={"temperature": 0, "num_predict": 64, "stop": ["zzz", "7"]}, stream=False,
    )
    assert "7" not in r.message.content and r.done_reason == "stop", r
    opts = {"temperature": 0.9, "seed": 11, "num_predict": 16, "top_k": 40, "top_p": 0.9, "num_ctx": 2048, "num_gpu": 0}
    a = client.chat(model=MODEL, messages=user("Tell me a story."), options=opts, stream=False).message.content
    b = client.chat(model=MODEL, messages=user("Tell me a story."), options=opts, stream=False).message.content
    assert a == b, (a, b)
    # The system prompt takes the template's default one's place.
    system = "You are a geography teacher. " * 20
    s = client.generate(model=MODEL, prompt=PROMPT, system=system, options=GREEDY)
    assert s.prompt_eval_count > client.generate(model=MODEL, prompt=PROMPT, options=GREEDY).prompt_eval_count + 80


@check
def format_json_and_a_schema_are_followed():
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
    }
    r = client.chat(
        model=MODEL, messages=user("The largest city of France, as JSON."), format=schema,
        options={"temperature": 0, "num_predict": 96}, stream=False,
    )
    jsonschema.validate(json.loads(r.message.content), schema)
    g = client.generate(model=MODEL, prompt="A JSON object describing a cat:", format="json", raw=True,
                        options={"temperature": 0, "num_predict": 96})
    assert isinstance(json.loads(g.response), dict), g.response


def turn(city, temp):
    """One earlier exchange, as Ollama's clients send it back: a call, its result, the answer."""
    return [
        *user(f"Weather in {city}?"),
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}]},
        {"role": "tool", "content": f"{temp} C", "tool_name": "get_weather"},
        {"role": "assistant", "content": f"It is {temp} C in {city}."},
    ]


@check
def tools_give_schema_valid_calls_whole_and_streamed():
    # Two earlier exchanges show the 135M model what to do (alone it rarely calls under auto).
    history = [*turn("Paris", 18), *turn("Berlin", 12), *user("Weather in Oslo?")]
    opts = {"temperature": 0, "num_predict": 128}
    r = client.chat(model=MODEL, messages=history, tools=[WEATHER], options=opts, stream=False)
    calls = r.message.tool_calls or []
    assert calls and r.done_reason == "stop", r
    for c in calls:
        assert c.function.name == "get_weather", c
        jsonschema.validate(dict(c.function.arguments), WEATHER["function"]["parameters"])
    # Streamed: each call arrives whole, in one line, the same as the whole answer's.
    lines = list(client.chat(model=MODEL, messages=history, tools=[WEATHER], options=opts, stream=True))
    streamed = [c for l in lines for c in (l.message.tool_calls or [])]
    assert [c.function for c in streamed] == [c.function for c in calls], (streamed, calls)
    assert lines[-1].done and not lines[-1].message.tool_calls, lines[-1]
    # Tools are part of the prompt.
    bare = client.chat(model=MODEL, messages=history, options={"num_predict": 1}, stream=False)
    assert bare.prompt_eval_count < r.prompt_eval_count, (bare.prompt_eval_count, r.prompt_eval_count)


@check
def tags_show_ps_and_version_describe_the_model():
    tags = client.list()
    assert [m.model for m in tags.models] == [MODEL + ":latest"], tags
    d = tags.models[0].details
    assert d.format == "gguf" and d.family == "llama" and d.parameter_size.endswith("M"), d
    assert d.quantization_level in ("Q4_1", "Q8_0"), d
    assert tags.models[0].size > 50_000_000, tags.models[0]
    s = client.show(MODEL)
    assert s.details.family == "llama" and s.modelinfo["general.architecture"] == "llama", s
    assert "completion" in s.capabilities and "im_start" in s.template, s
    ps = client.ps()
    assert ps.models[0].model == MODEL + ":latest" and ps.models[0].context_length > 0, ps
    status, body = raw("GET", "/api/version")
    assert status == 200 and json.loads(body)["version"], body


@check
def pull_goes_through_the_store_and_an_unknown_model_explains():
    assert client.pull(MODEL).status == "success"
    # Another catalog model: fetched (or found and re-verified) in strata's store, with
    # Ollama's progress lines.
    lines = [p.status for p in client.pull("gemma3-270m", stream=True)]
    assert lines[0] == "pulling manifest" and lines[-1] == "success", lines
    assert "verifying sha256 digest" in lines or "gemma3-270m is in the store already" in lines, lines
    try:
        client.pull("llama3.2")
        raise AssertionError("pulled a model strata's catalog does not have")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and "catalog" in e.error, e.error


@check
def errors_are_ollama_error_objects():
    try:
        client.chat(model="nope", messages=user("Hi"))
        raise AssertionError("an unknown model was served")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and "not found" in e.error, e.error
    cases = [
        ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}], "stream": False}, "role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
        ({"model": MODEL, "messages": user("x"), "format": 3}, "format"),
        ({"model": MODEL, "messages": user("x"), "options": {"temperature": 9}}, "temperature"),
        ({"model": MODEL, "messages": 5}, None),
        (b"{broken", None),
    ]
    for body, words in cases:
        status, text = raw("POST", "/api/chat", body)
        assert status == 400, (body, status, text)
        err = json.loads(text)["error"]
        assert isinstance(err, str) and err, text
        if words:
            assert words in err, (words, err)
    status, text = raw("POST", "/api/generate", {"model": MODEL, "prompt": "x", "context": [1, 2]})
    assert status == 400 and "context" in json.loads(text)["error"], text


@check
def think_keep_alive_and_num_ctx_are_answered_as_ollama_does():
    # A model without a thinking template refuses `think`, as Ollama does.
    try:
        client.chat(model=MODEL, messages=user("Hi"), think=True)
        raise AssertionError("think was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "does not support thinking" in e.error, e.error
    assert client.chat(model=MODEL, messages=user("Hi"), think=False, options={"num_predict": 2}).message.content
    # Nothing to generate: the model is loaded, or unloaded with keep_alive 0.
    for path, empty in [("/api/chat", {"messages": []}), ("/api/generate", {"prompt": ""})]:
        for keep, reason in [(None, "load"), (0, "unload"), ("0s", "unload"), ("5m", "load")]:
            body = {"model": MODEL, **empty, **({} if keep is None else {"keep_alive": keep})}
            status, text = raw("POST", path, body)
            assert status == 200 and json.loads(text)["done_reason"] == reason, (path, keep, text)
    # num_ctx below the server's window holds prompt and answer together.
    r = client.chat(model=MODEL, messages=user("Hi"), options={"num_predict": 50, "temperature": 0})
    window = r.prompt_eval_count + 3
    r = client.chat(model=MODEL, messages=user("Hi"), options={"num_predict": 50, "num_ctx": window, "temperature": 0})
    assert r.eval_count == 3 and r.done_reason == "length", r
    try:
        client.chat(model=MODEL, messages=user("Hi"), options={"num_ctx": 4})
        raise AssertionError("a prompt over num_ctx was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "num_ctx" in e.error, e.error


@check
def embed_and_the_older_embeddings_route_give_the_same_unit_vectors():
    r = client.embed(model=MODEL, input=["The capital of France is Paris.", "Hello"])
    assert len(r.embeddings) == 2 and all(len(v) == 576 for v in r.embeddings), r
    assert all(abs(sum(x * x for x in v) - 1) < 1e-5 for v in r.embeddings)
    assert r.prompt_eval_count > 5, r
    old = client.embeddings(model=MODEL, prompt="Hello")
    assert list(old.embedding) == list(r.embeddings[1]), "the two routes differ"
    one = client.embed(model=MODEL, input="Hello", dimensions=32)
    assert len(one.embeddings[0]) == 32


@check
def keys_are_required_as_bearer():
    keyed = os.environ["STRATA_KEYED_URL"]
    status, _ = raw("GET", "/api/tags", base=keyed)
    assert status == 401, status
    good = ollama.Client(host=keyed, headers={"Authorization": "Bearer " + os.environ["STRATA_KEY"]})
    assert good.list().models


@check
def hostile_bodies_never_get_a_5xx():
    bodies = [
        {"model": MODEL, "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}], "stream": False, "options": {"num_predict": 2}},
        {"model": MODEL, "messages": user("x"), "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "nope"}}}]},
        {"model": MODEL, "messages": user("x"), "options": {"stop": [""]}},
        {"model": MODEL, "messages": user("x" * 200000)},
        {"model": MODEL, "prompt": 5},
    ]
    for b in bodies:
        for path in ("/api/chat", "/api/generate", "/api/show", "/api/pull"):
            status, text = raw("POST", path, b)
            assert status < 500, (path, b, status, text[:300])
            if status >= 400:
                assert isinstance(json.loads(text)["error"], str), text[:300]


run()
