"""What the client scripts share: registering checks, raw HTTP requests, and the report.

Each script registers its checks with `@check` and ends with `run()`, which prints one line per
check and "N passed, M failed", and exits non-zero when any failed.

The client scripts (anthropic_client.py, ollama_client.py, responses_client.py) read their servers
from the environment: STRATA_URL (an open server), STRATA_KEYED_URL (one with keys), STRATA_MODEL,
STRATA_RUN_TEXT (what `strata run` printed greedily for PROMPT), STRATA_KEY (a valid key).
"""
import json
import os
import sys
import traceback
import urllib.error
import urllib.request

URL = os.environ.get("STRATA_URL", "")
MODEL = os.environ.get("STRATA_MODEL", "")
PROMPT = "What is the capital of France?"

# The weather tool every API's checks use, as a JSON schema of its arguments.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
WEATHER_DESCRIPTION = "Current weather of a city"

checks = []


def check(fn):
    checks.append(fn)
    return fn


def raw(method, path, body=None, headers=None, base=None):
    """One request without a client library: (status, body bytes), errors included. A body that
    is not bytes is sent as JSON unless `headers` name another content type."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request((base or URL) + path, data=data, method=method, headers=headers or {})
    if data is not None and not req.has_header("Content-type"):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def report(results):
    """`results`: (name, exception text or None) pairs, printed as they come."""
    passed = failed = 0
    for name, error in results:
        if error is None:
            passed += 1
            print(f"ok   {name}", flush=True)
        else:
            failed += 1
            print(f"FAIL {name}\n{error}", flush=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def attempt(name, fn):
    try:
        fn()
        return name, None
    except Exception:
        return name, traceback.format_exc()


def run():
    report(attempt(fn.__name__, fn) for fn in checks)
