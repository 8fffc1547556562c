#!/usr/bin/env python3
"""How long a stream stalls while a long prompt is admitted (chunked prefill).

Starts `strata serve`, measures the long prompt's prefill alone (its time to first token with
nothing else running: the stall a stream would see if the prompt ran in one piece), then
streams a long answer and, a few tokens in, sends the long prompt; prints the stream's worst
gap between two tokens while the prompt was admitted, and its median gap. Medians of --runs.

    python3 scripts/bench-gap.py --strata target/release/strata [--prompt-tokens 1500]
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import threading
import time

MODEL = "smollm2-135m-instruct"


def post(port, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


def long_prompt(words):
    return "Summarise: " + " ".join(f"fact {i} is that the sea is wide." for i in range(words // 8))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.expanduser("~/.cache/strata-ci-target/release/strata"))
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    port = 18600 + os.getpid() % 1000
    srv = subprocess.Popen([a.strata, "serve", "--api-addr", f"127.0.0.1:{port}", "--parallel", "2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        prompt = long_prompt(a.prompt_tokens)
        alone, worst, median, ptoks = [], [], [], 0
        for _ in range(a.runs):
            t = time.time()
            _, r = post(port, {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1})
            ptoks = json.loads(r.read())["usage"]["prompt_tokens"]
            alone.append(time.time() - t)
            c, r = post(port, {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
                               "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True})
            stamps, sent, done = [], threading.Event(), threading.Event()

            def long_request():
                post(port, {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": 1})[1].read()
                done.set()

            while True:
                line = r.readline()
                if not line or line.startswith(b"data: [DONE]"):
                    break
                if line.startswith(b"data:"):
                    stamps.append(time.time())
                    if len(stamps) == 20:
                        threading.Thread(target=long_request, daemon=True).start()
                        sent.set()
                    if done.is_set() and len(stamps) > 40 and stamps[-1] - stamps[-2] < 1:
                        break
            c.close()
            gaps = [b - a for a, b in zip(stamps[20:], stamps[21:])]
            worst.append(max(gaps))
            median.append(statistics.median(gaps))
        print(f"long prompt: {ptoks} tokens; its prefill alone {statistics.median(alone) * 1000:.0f} ms "
              f"(the stall without chunking)")
        print(f"stream while it was admitted: worst gap {statistics.median(worst) * 1000:.0f} ms, "
              f"median gap {statistics.median(median) * 1000:.1f} ms (medians of {a.runs} runs)")
    finally:
        srv.terminate()
        srv.wait(30)


if __name__ == "__main__":
    main()
