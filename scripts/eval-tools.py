"""Tool-call eval: does a served model return schema-valid calls, through OpenAI's and Anthropic's APIs?

22 tools whose schemas cover what clients send (nested objects, arrays with bounds, enums, anyOf
of object shapes, $ref/$defs and a recursive $ref, optional fields, numeric bounds, patterns, a
tool without parameters), two prompts each, under a forced call (`required` / `any`) and `auto`,
through /v1/chat/completions and /v1/messages, at most 128 tokens each. Passes when at least 95 %
of forced requests return a call that validates and every call returned (forced or not) validates.

    python3 scripts/eval-tools.py --url http://127.0.0.1:8000 --model smollm2-135m-instruct

Needs the `openai`, `anthropic` and `jsonschema` packages. Prints a table per API and mode, the
failures, and exits 1 when a threshold is missed.
"""
import argparse
import concurrent.futures
import json
import sys

import anthropic
import jsonschema
import openai

S = {"type": "string"}
TOOLS = [
    ("get_weather", "Current weather of a city",
     {"type": "object", "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]},
     ["What's the weather in Paris?", "Is it cold in Oslo today, in fahrenheit?"]),
    ("book_trip", "Book a trip for a traveller",
     {"type": "object", "properties": {
         "destination": S,
         "traveller": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name"]},
         "stops": {"type": "array", "items": S, "maxItems": 3}},
      "required": ["destination", "traveller"]},
     ["Book a trip to Rome for Ada, 36.", "I want to travel to Lisbon via Madrid. My name is Tom."]),
    ("add_numbers", "Add two integers",
     {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000}, "b": {"type": "integer", "minimum": -1000, "maximum": 1000}}, "required": ["a", "b"]},
     ["What is 12 plus 30?", "Add -5 and 7."]),
    ("create_event", "Create a calendar event",
     {"type": "object", "properties": {
         "title": S, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
         "attendees": {"type": "array", "items": S, "minItems": 1, "maxItems": 4}},
      "required": ["title", "date", "attendees"]},
     ["Schedule a team lunch on 2025-03-14 with Ana and Bo.", "Create an event 'Review' on 2024-12-01 with Kim."]),
    ("set_thermostat", "Set the thermostat",
     {"type": "object", "properties": {"temperature": {"type": "number", "minimum": 5, "maximum": 30}, "mode": {"enum": ["heat", "cool", "auto"]}}, "required": ["temperature", "mode"]},
     ["Heat the house to 21 degrees.", "Cool it down to 18."]),
    ("search_products", "Search the shop",
     {"type": "object", "properties": {
         "query": S,
         "filters": {"type": "object", "properties": {"max_price": {"type": "number", "minimum": 0}, "category": {"enum": ["books", "toys", "tools"]}}},
         "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
      "required": ["query"]},
     ["Find books about Rust under 30 dollars.", "Show me 5 toy robots."]),
    ("send_email", "Send an email",
     {"type": "object", "properties": {"to": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9.]+$"}, "subject": S, "body": {"type": "string", "maxLength": 200}}, "required": ["to", "subject", "body"]},
     ["Email bob@example.com that the meeting moved to 3pm.", "Send ana@mail.org a thank-you note."]),
    ("get_time", "The current time", None,
     ["What time is it?", "Tell me the time."]),
    ("shape_area", "Area of a shape",
     {"type": "object", "properties": {"shape": {"anyOf": [
         {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0}}, "required": ["kind", "radius"]},
         {"type": "object", "properties": {"kind": {"const": "rect"}, "width": {"type": "number", "minimum": 0}, "height": {"type": "number", "minimum": 0}}, "required": ["kind", "width", "height"]}]}},
      "required": ["shape"]},
     ["Area of a circle of radius 2?", "Area of a 3 by 4 rectangle?"]),
    ("ship_package", "Ship a package between two addresses",
     {"type": "object", "$defs": {"Address": {"type": "object", "properties": {"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"]}},
      "properties": {"from": {"$ref": "#/$defs/Address"}, "to": {"$ref": "#/$defs/Address"}, "weight_kg": {"type": "number", "minimum": 0, "maximum": 70}},
      "required": ["from", "to"]},
     ["Ship from 1 Main St, Springfield 12345 to 9 Elm Rd, Shelbyville 54321.", "Send a 2 kg box from 5 Oak Ave, Austin 73301 to 7 Pine St, Dallas 75201."]),
    ("translate", "Translate text",
     {"type": "object", "properties": {"text": S, "target_language": {"enum": ["fr", "de", "es", "it"]}}, "required": ["text", "target_language"]},
     ["Translate 'good morning' to French.", "How do you say 'thank you' in German?"]),
    ("create_todo", "Create a todo list",
     {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {"task": S, "done": {"type": "boolean"}}, "required": ["task", "done"]}}}, "required": ["items"]},
     ["Make a todo list: buy milk, call mom.", "Add 'write report' to my todos."]),
    ("rate_movie", "Rate a movie",
     {"type": "object", "properties": {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5}, "review": S}, "required": ["title", "stars"]},
     ["Give Inception 5 stars.", "Rate Cats 1 star, it was awful."]),
    ("convert_currency", "Convert money between currencies",
     {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}, "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["amount", "from", "to"]},
     ["Convert 100 USD to EUR.", "How much is 50 GBP in JPY?"]),
    ("schedule_meeting", "Schedule a meeting",
     {"type": "object", "properties": {"participants": {"type": "array", "items": S, "minItems": 2, "maxItems": 6}, "duration_minutes": {"enum": [15, 30, 60]}}, "required": ["participants", "duration_minutes"]},
     ["Set up a 30 minute meeting with Ana and Bo.", "Book an hour with Kim, Lee and Max."]),
    ("lookup_user", "Find a user by id or by email",
     {"type": "object", "properties": {"by": {"oneOf": [
         {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"]},
         {"type": "object", "properties": {"email": S}, "required": ["email"]}]}}, "required": ["by"]},
     ["Look up user 42.", "Find the user with email kim@example.com."]),
    ("set_light", "Control a light",
     {"type": "object", "properties": {"room": {"enum": ["kitchen", "bedroom", "office"]}, "on": {"type": "boolean"}, "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["room", "on"]},
     ["Turn on the kitchen light.", "Dim the bedroom light to 20 percent."]),
    ("make_outline", "Make an outline of sections",
     {"type": "object", "properties": {"title": S, "sections": {"type": "array", "maxItems": 3, "items": {"$ref": "#"}}}, "required": ["title"]},
     ["Outline an essay about bees.", "Make an outline for a talk on Rust with two sections."]),
    ("log_expense", "Log an expense",
     {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}, "category": {"enum": ["food", "travel", "office"]}, "tags": {"type": "array", "items": S, "maxItems": 3}, "note": S}, "required": ["amount", "category"]},
     ["I spent 12.50 on lunch.", "Log a 300 dollar flight."]),
    ("play_music", "Play music",
     {"type": "object", "properties": {"artist": S, "song": S, "shuffle": {"type": "boolean"}}, "required": ["artist"]},
     ["Play some Beatles.", "Play Bohemian Rhapsody by Queen."]),
    ("calculate_route", "Route through waypoints",
     {"type": "object", "properties": {"waypoints": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"]}}}, "required": ["waypoints"]},
     ["Route from 48.85,2.35 to 51.5,-0.12.", "Plan a route through 40.7,-74.0 and 34.0,-118.2."]),
    ("get_stock_price", "Latest stock price",
     {"type": "object", "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, "required": ["ticker"]},
     ["What's Apple's stock price?", "Price of MSFT?"]),
]

MAX_TOKENS = 128


def params(schema):
    return schema if schema is not None else {"type": "object", "properties": {}}


def check_call(name, args, tool):
    """Why a returned call is invalid, or None."""
    if name != tool[0]:
        return f"called {name!r}, not {tool[0]!r}"
    schema = params(tool[2])
    try:
        jsonschema.Draft202012Validator(schema).validate(args)
    except jsonschema.ValidationError as e:
        return f"arguments {json.dumps(args)} do not validate: {e.message}"
    return None


def via_openai(client, model, tool, prompt, forced):
    t = {"type": "function", "function": {"name": tool[0], "description": tool[1]}}
    if tool[2] is not None:
        t["function"]["parameters"] = tool[2]
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], tools=[t],
        tool_choice="required" if forced else "auto", max_tokens=MAX_TOKENS, temperature=0,
    )
    calls = r.choices[0].message.tool_calls or []
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def via_anthropic(client, model, tool, prompt, forced):
    t = {"name": tool[0], "description": tool[1], "input_schema": params(tool[2])}
    r = client.messages.create(
        model=model, messages=[{"role": "user", "content": prompt}], tools=[t], max_tokens=MAX_TOKENS,
        tool_choice={"type": "any" if forced else "auto"}, extra_body={"temperature": 0},
    )
    return [(b.name, b.input) for b in r.content if b.type == "tool_use"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    oa = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=a.url, api_key="unused", max_retries=0, timeout=300)
    apis = {"openai": (via_openai, oa), "anthropic": (via_anthropic, an)}
    jobs = [(api, forced, tool, prompt) for api in apis for forced in (True, False)
            for tool in TOOLS for prompt in tool[3]]

    def one(job):
        api, forced, tool, prompt = job
        fn, client = apis[api]
        try:
            calls = fn(client, a.model, tool, prompt, forced)
        except Exception as e:  # a failed request is a failure, not a crash of the eval
            return job, [], [f"request failed: {e}"]
        return job, calls, [w for w in (check_call(n, args, tool) for n, args in calls) if w]

    with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
        results = list(pool.map(one, jobs))
    ok = True
    rows = []
    print(f"{len(TOOLS)} tools x 2 prompts, max_tokens {MAX_TOKENS}, model {a.model}")
    print(f"{'api':<10} {'mode':<9} {'requests':>8} {'with call':>9} {'calls':>6} {'valid':>6}")
    for api in apis:
        for forced in (True, False):
            mine = [r for r in results if r[0][0] == api and r[0][1] == forced]
            with_valid_call = sum(1 for _, calls, bad in mine if calls and not bad)
            n_calls = sum(len(calls) for _, calls, _ in mine)
            n_bad = sum(len(bad) for _, _, bad in mine)
            mode = "required" if forced else "auto"
            print(f"{api:<10} {mode:<9} {len(mine):>8} {with_valid_call:>9} {n_calls:>6} {n_calls - n_bad:>6}")
            rows.append({"api": api, "mode": mode, "requests": len(mine), "with_valid_call": with_valid_call,
                         "calls": n_calls, "invalid": n_bad})
            if forced and with_valid_call < 0.95 * len(mine):
                ok = False
            if n_bad:
                ok = False
    for (api, forced, tool, prompt), calls, bad in results:
        if bad or (forced and not calls):
            print(f"  {api} {'required' if forced else 'auto'} {tool[0]} {prompt!r}: {bad or 'no call'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("PASS" if ok else "FAIL: under 95 % of forced requests gave a valid call, or a call did not validate")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
