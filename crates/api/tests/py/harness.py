"""What the client scripts share: registering checks, raw HTTP requests, and the report.

Each script registers its checks with `@check` and ends with `run()`, which prints one line per
check and "N passed, M failed", and exits non-zero when any failed.
"""
import json
import sys
import traceback
import urllib.error
import urllib.request

checks = []


def check(fn):
    checks.append(fn)
    return fn


def raw(base, method, path, body=None, headers=None):
    """One request without a client library: (status, body bytes), errors included. A body that
    is not bytes is sent as JSON unless `headers` name another content type."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
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
