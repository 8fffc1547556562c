#!/usr/bin/env python3
"""Soak test: many concurrent clients against `strata serve`, then a 2-node cluster.

Sixteen client threads mix streamed and whole chats, tool calls, JSON-schema output,
completions, cancelled streams, bad requests and hostile schemas (reference chains deeper
than a thread's stack, mutually recursive definitions, patterns of nested repetitions, through
every dialect's structured output and tool parameters) for a while against `strata serve` on
loopback; then against a 2-node tensor-parallel cluster in network namespaces (root and
iproute2 needed), with one node killed and restarted halfway. It prints, per phase, the
answers by kind and status, the 5xx answers to valid requests (outside the window in which
a node was down), requests left without any answer, and resident memory over time (the last
minute's mean must be within 10 % of the second minute's).

Only stdlib; every connection goes to 127.0.0.1 or to the namespaces this script makes, and
every loop ends with its phase. Exit status 0 when every check held.

    python3 scripts/soak.py                       # 6 + 6 minutes
    python3 scripts/soak.py --minutes 2 --no-cluster
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"]}}}
QUESTIONS = ["What is a CPU?", "Name three rivers.", "Write a haiku about rain.",
             "What is the weather in Paris?", "Explain recursion briefly.", "Count to ten."]


def ref_chain(n):
    """`d0 -> d1 -> ... -> {"type": "string"}`: deeper than a thread's stack at n = 700."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def mutual(names):
    """Definitions each an array of any of all of them."""
    return {"$defs": {x: {"type": "array", "items": {"anyOf": [{"$ref": f"#/$defs/{y}"} for y in names]}}
                      for x in names}, "$ref": f"#/$defs/{names[0]}"}


def hostile(rng):
    """(path, body) of a schema that once took the process down, through one of the dialects."""
    schema = rng.choice([
        ref_chain(700), ref_chain(rng.randint(65, 255)), mutual("ABCDE"), mutual("ABCD"),
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(x{1000}){1000}$"}}},
        {"type": "string", "pattern": "^(a{%d}){%d}$" % (rng.randint(50, 500), rng.randint(50, 500))},
    ])
    msgs = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    fn = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return rng.choice([
        ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 16,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "x", "schema": schema}}}),
        ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 16,
                                  "tools": [fn], "tool_choice": "required"}),
        ("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "format": schema,
                       "options": {"num_predict": 16}}),
        ("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 16,
                           "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}),
        ("/v1/messages", {"model": MODEL, "messages": msgs, "max_tokens": 16,
                          "tools": [{"name": "f", "input_schema": schema}], "tool_choice": {"type": "any"}}),
    ])


def request(kind, rng):
    """(method, path, body bytes, valid?) for one request of `kind`."""
    if kind == "hostile":
        path, body = hostile(rng)
        return path, json.dumps(body).encode(), True
    msgs = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": rng.randint(8, 48)}
    if kind == "chat_stream" or kind == "cancel":
        body["stream"] = True
    elif kind == "tools":
        body.update(tools=[WEATHER], tool_choice=rng.choice(["auto", "required"]), stream=rng.random() < 0.5)
    elif kind == "json":
        body["response_format"] = SCHEMA
    elif kind == "completion":
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": rng.randint(4, 32)}
        return "/v1/completions", json.dumps(body).encode(), True
    elif kind == "bad":
        return "/v1/chat/completions", rng.choice([
            b"{not json", json.dumps({"model": "nope", "messages": msgs}).encode(),
            json.dumps({"model": MODEL, "messages": msgs, "temperature": -3}).encode(),
            json.dumps({"model": MODEL, "messages": []}).encode(),
            json.dumps({"model": MODEL, "messages": msgs, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}).encode(),
        ]), False
    return "/v1/chat/completions", json.dumps(body).encode(), True


KINDS = ["chat", "chat_stream", "tools", "json", "completion", "cancel", "bad", "hostile"]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by = {}          # (kind, status) -> count
        self.valid_5xx = []   # (time, kind, status, message)
        self.unanswered = []  # (time, kind, error)
        self.total = 0

    def add(self, kind, status, t, msg=""):
        with self.lock:
            self.total += 1
            self.by[(kind, status)] = self.by.get((kind, status), 0) + 1
            if status >= 500 and kind != "bad":
                self.valid_5xx.append((t, time.time(), kind, status, msg[:200]))


def one(host, port, kind, rng, stats):
    path, body, _ = request(kind, rng)
    t = time.time()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status == 200 and r.getheader("Content-Type", "").startswith("text/event-stream"):
            chunks = 0
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    chunks += 1
                    if b'"error"' in line:
                        stats.add(kind, 599, t, line.decode(errors="replace"))
                        return
                    if kind == "cancel" and chunks >= 3:
                        conn.sock.close()  # the client walks away mid-stream
                        stats.add(kind, 200, t)
                        return
            stats.add(kind, r.status, t)
        else:
            data = r.read()
            msg = data.decode(errors="replace")
            stats.add(kind, r.status, t, msg)
    except Exception as e:  # no answer at all: what the soak must never see
        with stats.lock:
            stats.unanswered.append((t, time.time(), kind, repr(e)[:200]))
    finally:
        conn.close()


def clients(host, port, seconds, n=16, seed=1):
    stats = Stats()
    deadline = time.time() + seconds

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        while time.time() < deadline:
            one(host, port, rng.choice(KINDS), rng, stats)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=seconds + 180)
    return stats


def rss_mib(pid):
    """Resident memory of `pid` and all its descendants (a node's worker ranks), MiB."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


class Sampler(threading.Thread):
    """VmRSS of the given pids (summed) every 5 s."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.samples, self.stop = list(pids), [], threading.Event()

    def run(self):
        t0 = time.time()
        while not self.stop.wait(5):
            vals = [rss_mib(p) for p in self.pids]
            self.samples.append((time.time() - t0, sum(v for v in vals if v)))


def wait_http(host, port, path, seconds, ok=lambda s, b: s == 200):
    end = time.time() + seconds
    while time.time() < end:
        try:
            c = http.client.HTTPConnection(host, port, timeout=5)
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            if ok(r.status, body):
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def report(name, stats, sampler, minutes, down=None, steady_from=60):
    """Prints a phase's numbers; `down` is the (start, end) of an outage on purpose, and
    `steady_from` the second from which memory should be flat (its first minute is compared
    with the last)."""
    print(f"\n== {name}: {stats.total} requests in {minutes} min")
    for (kind, status), n in sorted(stats.by.items()):
        print(f"  {kind:12s} {status}: {n}")
    # A request counts as hit by the outage when its life overlaps it.
    outside = [v for v in stats.valid_5xx if not (down and v[0] <= down[1] and v[1] >= down[0])]
    inside = len(stats.valid_5xx) - len(outside)
    print(f"  5xx to valid requests: {len(outside)}" + (f" (+{inside} while a node was down)" if down else ""))
    for v in outside[:5]:
        print(f"    {v}")
    print(f"  requests without an answer: {len(stats.unanswered)}")
    for v in stats.unanswered[:5]:
        print(f"    {v}")
    ok = not outside and not stats.unanswered
    s = sampler.samples
    first = [m for t, m in s if steady_from <= t < steady_from + 60]
    last = [m for t, m in s if t >= s[-1][0] - 60] if s else []
    if first and last and s[-1][0] - 60 >= steady_from + 60:
        a, b = sum(first) / len(first), sum(last) / len(last)
        drift = (b - a) / a * 100
        print(f"  RSS (with worker ranks): {a:.0f} MiB in the minute from {steady_from:.0f} s, "
              f"{b:.0f} MiB in the last minute ({drift:+.1f} %)")
        ok = ok and abs(drift) <= 10
    else:
        print("  RSS: the phase was too short to compare two separate minutes")
    print(f"  verdict: {'ok' if ok else 'FAILED'}")
    return ok


def serve_phase(strata, minutes):
    port = 18700 + os.getpid() % 1000
    # Unsupervised: a process that dies must fail the phase, not be restarted behind its back.
    proc = subprocess.Popen([strata, "serve", "--no-supervise", "--api-addr", f"127.0.0.1:{port}", "--parallel", "4",
                             "--queue", "64", "--max-connections", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_http("127.0.0.1", port, "/health", 300):
            print("strata serve did not come up", file=sys.stderr)
            return False
        sampler = Sampler([proc.pid])
        sampler.start()
        stats = clients("127.0.0.1", port, minutes * 60)
        sampler.stop.set()
        ok = report("strata serve", stats, sampler, minutes)
        if proc.poll() is not None:
            print(f"  strata serve exited during the phase (status {proc.returncode})")
            ok = False
        return ok
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def cluster_phase(strata, minutes):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("the cluster phase needs root and iproute2; skipped", file=sys.stderr)
        return False
    pre = f"sk{os.getpid() % 100000}"
    br, ns = f"{pre}br", [f"{pre}n1", f"{pre}n2"]
    tmp = tempfile.mkdtemp(prefix="strata-soak-")
    nodes = [None, None]
    try:
        ip("netns", "add", br)
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        for i, n in enumerate(ns, 1):
            ip("netns", "add", n)
            ip("-n", br, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", n)
            ip("-n", br, "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", n, "addr", "add", f"10.78.0.{i}/24", "dev", "eth0")
            ip("-n", n, "link", "set", "eth0", "up")
            ip("-n", n, "link", "set", "lo", "up")
            ip("-n", n, "route", "add", "224.0.0.0/4", "dev", "eth0")
        key = os.path.join(tmp, "cluster.key")
        subprocess.run([strata, "keygen", "--out", key], check=True, capture_output=True)

        def start(i):
            log = open(os.path.join(tmp, f"node{i + 1}.log"), "a")
            nodes[i] = subprocess.Popen(
                ["ip", "netns", "exec", ns[i], strata, "node", "--no-supervise", "--name", f"host{i + 1}",
                 "--state-dir", os.path.join(tmp, f"state{i + 1}"), "--cluster-key-file", key,
                 "--threads", "1", "--api-addr", "127.0.0.1:8000"],
                stdout=subprocess.DEVNULL, stderr=log)

        start(0)
        start(1)
        in_ns = ["ip", "netns", "exec", ns[0]]
        for _ in range(60):
            # Both nodes known by name, and a plan over both possible (links measured).
            out = subprocess.run(in_ns + [strata, "load", MODEL, "--nodes", "host1,host2", "--strategy",
                                          "tensor", "--dry-run", "--json"], capture_output=True, text=True)
            if out.returncode == 0:
                break
            time.sleep(1)
        load = subprocess.run(in_ns + [strata, "load", MODEL, "--nodes", "host1,host2", "--strategy",
                                       "tensor", "--json"], capture_output=True, text=True)
        if load.returncode != 0:
            print(f"loading failed: {load.stderr}", file=sys.stderr)
            return False
        # The client threads run inside host 1's namespace (its API is on its loopback).
        cmd = in_ns + [sys.executable, os.path.abspath(__file__), "--clients-only", "127.0.0.1:8000",
                       "--minutes", str(minutes), "--out", os.path.join(tmp, "stats.json")]
        load_gen = subprocess.Popen(cmd)
        sampler = Sampler([p.pid for p in nodes])
        sampler.start()
        t0 = time.time()
        time.sleep(minutes * 30)
        down_from = time.time()
        nodes[1].kill()
        nodes[1].wait()
        time.sleep(10)
        start(1)
        sampler.pids[1] = nodes[1].pid
        # Back: a completion answers 200 again.
        body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        for _ in range(120):
            out = subprocess.run(in_ns + ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "30",
                                          "-H", "Content-Type: application/json", "-d", body,
                                          "http://127.0.0.1:8000/v1/completions"],
                                 capture_output=True, text=True)
            if out.stdout == "200":
                break
            time.sleep(1)
        down = (down_from, time.time())
        print(f"node 2 was down (or being replaced) for {down[1] - down[0]:.0f} s")
        load_gen.wait(minutes * 60 + 300)
        sampler.stop.set()
        with open(os.path.join(tmp, "stats.json")) as f:
            raw = json.load(f)
        stats = Stats()
        stats.total = raw["total"]
        stats.by = {(k, int(s)): n for k, s, n in raw["by"]}
        stats.valid_5xx = [tuple(v) for v in raw["valid_5xx"]]
        print(f"the cluster phase's 503s while the instance was re-placed carry messages such as "
              f"{[v[4][:100] for v in stats.valid_5xx[:1]]}")
        stats.unanswered = [tuple(v) for v in raw["unanswered"]]
        # Memory is compared from the first minute after the placement settled again.
        return report("2-node cluster (tensor parallel), node 2 killed and restarted halfway",
                      stats, sampler, minutes, down, steady_from=down[1] - t0 + 10)
    finally:
        for p in nodes:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        for n in ns + [br]:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.expanduser("~/.cache/strata-ci-target/release/strata"))
    ap.add_argument("--minutes", type=float, default=6, help="length of each phase")
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--clients-only", metavar="HOST:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.clients_only:
        host, port = a.clients_only.rsplit(":", 1)
        s = clients(host, int(port), a.minutes * 60)
        with open(a.out, "w") as f:
            json.dump({"total": s.total, "by": [[k, st, n] for (k, st), n in s.by.items()],
                       "valid_5xx": s.valid_5xx, "unanswered": s.unanswered}, f)
        return 0
    ok = serve_phase(a.strata, a.minutes)
    if not a.no_cluster:
        ok = cluster_phase(a.strata, a.minutes) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
