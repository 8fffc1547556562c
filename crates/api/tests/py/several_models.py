"""Drives a `strata serve` with two models (STRATA_MODEL, the default model, and STRATA_SECOND,
served with a built-in chat template and the alias STRATA_SECOND_ALIAS): every API routes by the
request's model, the lists name both, an unknown model gets each API's own "not found".

Environment and report: see harness.py.
"""
import json
import os

from harness import MODEL, PROMPT, check, raw, run

SECOND = os.environ["STRATA_SECOND"]
ALIAS = os.environ["STRATA_SECOND_ALIAS"]


def post(path, body):
    status, data = raw("POST", path, body)
    return status, json.loads(data) if data.strip().startswith(b"{") else data


def chat(model, **extra):
    status, r = post("/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8,
        "temperature": 0, **extra,
    })
    assert status == 200, (status, r)
    return r


@check
def both_models_and_the_alias_are_listed_by_every_api():
    status, body = raw("GET", "/v1/models")
    assert status == 200
    ids = [m["id"] for m in json.loads(body)["data"]]
    assert set(ids) == {MODEL, SECOND, ALIAS}, ids
    for path in ["/api/tags", "/api/ps"]:
        status, body = raw("GET", path)
        names = [m["name"] for m in json.loads(body)["models"]]
        assert status == 200 and {MODEL + ":latest", SECOND + ":latest"} <= set(names), (path, names)
    status, body = raw("GET", "/v1/models/" + SECOND)
    assert status == 200 and json.loads(body)["id"] == SECOND, body
    status, body = raw("GET", "/v1/models/" + ALIAS)
    assert status == 200 and json.loads(body)["id"] == ALIAS, body


@check
def each_request_is_answered_by_the_model_it_names():
    a, b = chat(MODEL), chat(SECOND)
    assert a["model"] == MODEL and b["model"] == SECOND, (a["model"], b["model"])
    # Two different models (and tokenizers): the same prompt is not the same number of tokens.
    assert a["usage"]["prompt_tokens"] != b["usage"]["prompt_tokens"], (a["usage"], b["usage"])
    assert b["choices"][0]["message"]["content"], b
    via_alias = chat(ALIAS)
    assert via_alias["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert via_alias["usage"] == b["usage"]


@check
def anthropic_ollama_responses_and_completions_route_too():
    status, m = post("/v1/messages", {
        "model": SECOND, "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT}],
    })
    assert status == 200 and m["model"] == SECOND, (status, m)
    status, m = post("/api/chat", {
        "model": SECOND + ":latest", "stream": False, "messages": [{"role": "user", "content": PROMPT}],
        "options": {"num_predict": 4},
    })
    assert status == 200 and m["model"] == SECOND, (status, m)
    status, m = post("/api/show", {"model": SECOND})
    assert status == 200 and "start_of_turn" in m["template"], (status, str(m)[:300])
    status, r = post("/v1/responses", {"model": SECOND, "input": PROMPT, "max_output_tokens": 4})
    assert status == 200 and r["model"] == SECOND, (status, r)
    # A conversation may change models: stored responses are shared.
    status, r2 = post("/v1/responses", {
        "model": MODEL, "input": "And of Italy?", "previous_response_id": r["id"], "max_output_tokens": 4,
    })
    assert status == 200 and r2["model"] == MODEL, (status, r2)
    status, body = raw("GET", "/v1/responses/" + r["id"])
    assert status == 200 and json.loads(body)["id"] == r["id"]
    status, c = post("/v1/completions", {"model": SECOND, "prompt": "The capital of France is", "max_tokens": 4})
    assert status == 200 and c["model"] == SECOND, (status, c)


@check
def an_unknown_model_gets_each_apis_not_found():
    msgs = [{"role": "user", "content": PROMPT}]
    # Each names every model served (and the alias), whichever model's API answers.
    served = [MODEL, SECOND, ALIAS]
    status, e = post("/v1/chat/completions", {"model": "nope", "messages": msgs})
    assert status == 404 and e["error"]["code"] == "model_not_found", (status, e)
    assert all(f"`{m}`" in e["error"]["message"] for m in served), e
    status, e = post("/v1/messages", {"model": "nope", "max_tokens": 4, "messages": msgs})
    assert status == 404 and e["type"] == "error" and e["error"]["type"] == "not_found_error", (status, e)
    assert all(m in e["error"]["message"] for m in served), e
    status, e = post("/api/chat", {"model": "nope", "messages": msgs})
    assert status == 404 and "nope" in e["error"], (status, e)
    assert all(f'"{m}"' in e["error"] for m in served), e
    status, e = post("/v1/responses", {"model": "nope", "input": PROMPT})
    assert status == 404 and e["error"]["code"] == "model_not_found", (status, e)
    status, body = raw("GET", "/v1/models/nope")
    assert status == 404, (status, body)
    # Bodies that name no model, or are not JSON, get the usual 400, never a 5xx.
    for body in [b"{", b"[]", b'{"model": 5}', b"\xff"]:
        for path in ["/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/responses"]:
            status, _ = raw("POST", path, body)
            assert 400 <= status < 500, (path, body, status)


@check
def metrics_are_labelled_by_model():
    status, body = raw("GET", "/metrics")
    text = body.decode()
    assert status == 200
    for model in [MODEL, SECOND]:
        line = next((l for l in text.splitlines()
                     if l.startswith("strata_prompt_tokens_total") and f'model="{model}"' in l), None)
        assert line and float(line.split()[-1]) > 0, (model, line)


run()
