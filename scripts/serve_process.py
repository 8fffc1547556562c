"""Starts `strata serve` on a free loopback port for the benchmark scripts, and stops it."""
import contextlib
import subprocess
import sys


@contextlib.contextmanager
def serving(strata, model, *args):
    """Runs `strata serve --model MODEL ARGS...`; yields its base URL, stops it afterwards."""
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
        yield url
    finally:
        srv.terminate()
        srv.wait()
