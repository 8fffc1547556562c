"""Starts `strata serve` on a free loopback port for the benchmark scripts, and stops it."""
import contextlib
import json
import subprocess
import sys
import urllib.request


@contextlib.contextmanager
def serving(strata, model, *args):
    """Runs `strata serve --model MODEL ARGS...`; yields its base URL, stops it afterwards."""
    with serving_process(strata, model, *args) as (url, _):
        yield url


@contextlib.contextmanager
def serving_process(strata, model, *args):
    """As `serving`, but yields the base URL and the server's process id."""
    srv = subprocess.Popen([strata, "serve", "--model", model, "--api-addr", "127.0.0.1:0", *args],
                           stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in srv.stderr:
            if "http://" in line:
                url = line[line.index("http://"):].split()[0]
                break
        if not url:
            sys.exit("strata serve did not start")
        yield url, srv.pid
    finally:
        srv.terminate()
        srv.wait()


def stream_chunks(url, path, body, timeout=600):
    """POSTs `body` (JSON, with "stream": true) and yields the server-sent chunks, parsed."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                yield json.loads(line[6:])
