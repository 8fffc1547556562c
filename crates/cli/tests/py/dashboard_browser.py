"""Drives the dashboard in headless Chromium (Playwright pointed at the system's browser) against
a running two-node cluster, and fails loudly on the first thing that does not work:

1. the page loads in under a second, with a strict Content-Security-Policy;
2. the cluster view draws both nodes and the link between them with its measured latency;
3. the models view previews placements, unloads what runs, and loads MODEL with tensor
   parallelism, which then shows ready;
4. a chat answer streams in token by token, with its TTFT and tok/s, and the conversation is
   still there after a reload;
5. the metrics view shows tokens per second;
6. with --kill-pid, killing that node turns it red within 2 s and its instance is placed again;
7. no console errors or page errors (before the kill; afterwards only failed loads of the dead
   node's answers are allowed while the page learns it is gone).

Screenshots of every view go to --shots, named with --label.
"""

import argparse
import os
import re
import signal
import sys
import time

from playwright.sync_api import sync_playwright

p = argparse.ArgumentParser()
p.add_argument("--url", required=True)
p.add_argument("--chromium", default="/usr/bin/chromium")
p.add_argument("--shots", required=True)
p.add_argument("--label", default="desktop")
p.add_argument("--width", type=int, default=1280)
p.add_argument("--height", type=int, default=800)
p.add_argument("--nodes", default="", help="comma-separated node names")
p.add_argument("--model", required=True)
p.add_argument("--kill-pid", type=int)
p.add_argument("--kill-node")
p.add_argument("--admin-key", help="check the key prompt and roles instead (a node with keys)")
p.add_argument("--client-key")
p.add_argument("--single", action="store_true", help="the server is `strata serve`, not a node")
args = p.parse_args()
os.makedirs(args.shots, exist_ok=True)
nodes = args.nodes.split(",")


def cluster_status(page):
    """The node's `/v1/cluster/status`, fetched from the page with the page's key."""
    return page.evaluate("""async () => {
        const k = localStorage.getItem("strata.apiKey");
        const r = await fetch("/v1/cluster/status", {headers: k ? {Authorization: `Bearer ${k}`} : {}});
        return await r.json();
    }""")


def slow_events(page):
    """Too-slow-link events in the node's feed."""
    events = cluster_status(page).get("events") or []
    return sum(1 for e in events if re.search("too slow for tensor parallelism", e.get("what", "")))


def considered(page, instance):
    """The strategies the leader weighed when it placed `instance`, with their predictions
    (tok/s), read from the cluster status: the load's own figures, which a preview taken
    earlier may not match (a node's published probes can change in between)."""
    for i in cluster_status(page).get("instances") or []:
        if i.get("id") == instance:
            pairs = (i.get("placement") or {}).get("considered") or []
            return {k: v for k, v in pairs if isinstance(k, str)}
    return {}


def step(msg):
    print(f"[{args.label}] {msg}", flush=True)


def shot(name):
    page.screenshot(path=os.path.join(args.shots, f"{name}-{args.label}.png"), full_page=True)


def chat_metrics_reload():
    """Steps 4 and 5: a streamed answer, the metrics it moved, the conversation after a reload."""
    # 4. A streamed chat answer.
    page.click("nav a[data-view='chat']")
    page.wait_for_selector(f"#chat-model option[value='{args.model}']", state="attached", timeout=30000)
    page.click("#new-chat")
    page.fill("#set-temperature", "0")
    page.dispatch_event("#set-temperature", "change")
    page.fill("#set-max-tokens", "48")
    page.dispatch_event("#set-max-tokens", "change")
    page.fill("#prompt", "Write three sentences about the sea.")
    page.click("#send")
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 120:
        text = page.evaluate(
            "(() => { const m = document.querySelectorAll('#messages .msg.assistant .text');"
            " return m.length ? m[m.length - 1].textContent : ''; })()")
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        if page.is_enabled("#send"):
            break
        time.sleep(0.02)
    stats = page.text_content("#messages .msg.assistant:last-child .stats")
    step(f"answer streamed in {len(seen)} visible steps: {seen[-1][:80]!r}; {stats}")
    assert len(seen) >= 3, f"the answer did not stream (seen {seen})"
    assert "TTFT" in stats and "tok/s" in stats, stats
    shot("chat")

    # 5. Metrics: the answer's tokens per second (sampled since the page loaded).
    page.click("nav a[data-view='metrics']")
    # (polled from here: wait_for_function evaluates strings, which the page's policy forbids)
    t = time.monotonic()
    while not re.search(r"peak [1-9]", page.text_content("[data-metric='generated tokens/s'] small") or ""):
        assert time.monotonic() - t < 15, "the metrics view shows no generated tokens"
        time.sleep(0.1)
    # A few more samples, so the charts (and the screenshot) show the answer's rise and fall.
    while int(re.search(r"last (\d+) s", page.text_content("[data-metric='generated tokens/s'] small")).group(1)) < 6:
        assert time.monotonic() - t < 30, "the metrics stopped sampling"
        time.sleep(0.2)
    step("metrics: " + page.text_content("[data-metric='generated tokens/s'] small"))
    shot("metrics")

    # Conversations are kept across reloads.
    page.reload(wait_until="load")
    page.click("nav a[data-view='chat']")
    page.wait_for_selector("#messages .msg.assistant", timeout=5000)
    assert seen[-1][:20] in page.text_content("#messages"), "the conversation was lost on reload"


errors, late_errors = [], []
killed = False


def on_console(m):
    if m.type == "error":
        (late_errors if killed else errors).append(m.text)


with sync_playwright() as pw:
    browser = pw.chromium.launch(
        executable_path=args.chromium,
        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
    )
    page = browser.new_page(viewport={"width": args.width, "height": args.height})
    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

    if args.admin_key:
        # A node with keys: the page asks for one; a client key sees the cluster but is offered
        # no admin action; an admin key is; a wrong key is refused in the prompt.
        page.goto(args.url, wait_until="load")
        page.wait_for_selector("#key-dialog[open]", timeout=10000)
        shot("key-prompt")
        page.fill("#key-input", args.client_key)
        page.click("#key-save")
        t = time.monotonic()
        while "(client)" not in (page.text_content("#whoami") or ""):
            assert time.monotonic() - t < 10, page.text_content("#whoami")
            time.sleep(0.1)
        page.wait_for_selector(f"#graph g.node.up[data-node='{nodes[0]}']", timeout=10000)
        page.click("nav a[data-view='models']")
        page.wait_for_selector(f"#catalog tr[data-model='{args.model}']", timeout=10000)
        assert not page.query_selector_all("button[data-preview]"), "a client key is offered admin actions"
        step("client key: cluster shown, no admin action offered")
        page.click("#key-button")
        page.fill("#key-input", "sk-not-a-key-000000")
        page.click("#key-save")
        page.wait_for_selector("#key-dialog[open]", timeout=10000)
        t = time.monotonic()
        while "refused" not in (page.text_content("#key-error") or ""):
            assert time.monotonic() - t < 10, page.text_content("#key-error")
            time.sleep(0.1)
        step("wrong key: " + page.text_content("#key-error"))
        page.fill("#key-input", args.admin_key)
        page.click("#key-save")
        page.wait_for_selector(f"button[data-preview='{args.model}']", timeout=10000)
        assert "(admin)" in page.text_content("#whoami")
        step("admin key: admin actions offered")
        # Only the refusals of the missing and wrong keys may have failed.
        bad = [e for e in errors if "status of 401" not in e]
        assert not bad, bad
        browser.close()
        step("ok")
        sys.exit(0)

    # 1. Loads fast, with the policy. A machine busy with other tests only adds delay to a
    # load, never takes it away: the best of up to three loads is judged.
    load_s = float("inf")
    for _ in range(3):
        t = time.monotonic()
        resp = page.goto(args.url, wait_until="load")
        load_s = min(load_s, time.monotonic() - t)
        if load_s < 1.0:
            break
    csp = resp.headers.get("content-security-policy", "")
    assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
    nav = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
    step(f"page loaded in {load_s * 1000:.0f} ms (navigation timing {nav[:160]}...)")
    assert load_s < 1.0, f"the page took {load_s:.2f} s to load"

    if args.single:
        t = time.monotonic()
        while page.text_content("#whoami") != "strata serve":
            assert time.monotonic() - t < 10, page.text_content("#whoami")
            time.sleep(0.1)
        assert "A single server" in page.text_content("#view-cluster")
        shot("cluster")
        chat_metrics_reload()
        assert not errors, f"console errors: {errors}"
        browser.close()
        step("ok")
        sys.exit(0)

    # 2. Both nodes and the measured link.
    for n in nodes:
        page.wait_for_selector(f"#graph g.node.up[data-node='{n}']", timeout=20000)
        page.wait_for_selector(f".node-card.up[data-node='{n}']", timeout=5000)
    label = page.wait_for_selector("#graph .link-label", timeout=20000)
    latency = label.text_content()
    assert re.fullmatch(r"[\d.]+ (µs|ms)", latency), latency
    # Once a data-plane probe measured it, the link says which transport it took.
    page.wait_for_function(
        "() => /over (tcp|shm)$/.test(document.querySelector('#graph .link-sub')?.textContent || '')",
        timeout=30000)
    sub = page.query_selector("#graph .link-sub").text_content()
    step(f"graph: nodes {nodes}, link latency {latency}, {sub}")
    shot("cluster")

    # 3. Unload whatever runs, preview, load with tensor parallelism.
    page.click("nav a[data-view='models']")
    page.wait_for_selector(f"#catalog tr[data-model='{args.model}']", timeout=20000)
    for b in page.query_selector_all("#models-instances button[data-unload]"):
        inst = b.get_attribute("data-unload")
        b.click()
        page.wait_for_selector(f"#models-instances tr[data-instance='{inst}']", state="detached", timeout=20000)
        step(f"unloaded {inst}")
    # Pulling by reference through the form: the model is in the store, so it says so at once.
    page.fill("#model-ref", args.model)
    page.click("#pull-button")
    page.wait_for_selector(f"#models-message.ok:has-text('{args.model} is on this node.')", timeout=60000)
    step("pull through the form: on this node")
    page.click(f"button[data-preview='{args.model}']")
    try:
        row = page.wait_for_selector(".preview tr[data-strategy='tensor'] td.num", timeout=30000)
    except Exception:
        # Say what the preview showed instead (a plan's error, or no tensor row at all).
        step(f"preview without a tensor figure: {page.text_content('#preview')!r}")
        raise
    step(f"preview: tensor predicted {row.text_content()}")
    page.wait_for_selector(".preview tr[data-strategy='pipeline'] td.num", timeout=30000)
    predicted = {}
    for s in ("single", "tensor", "pipeline"):
        cell = page.query_selector(f".preview tr[data-strategy='{s}'] td.num")
        if cell:
            predicted[s] = float(cell.text_content().split()[0])
    # Events of an earlier load (another pass over the same nodes) stay in the feed: count
    # them now, from the API (the feed on the page is redrawn only while it is shown).
    slow = "#events li:has-text('too slow for tensor parallelism')"
    slow_before = slow_events(page)
    page.select_option("#load-strategy", "tensor")
    page.click("#load-button")
    ready = page.wait_for_selector("#models-instances tr[data-state='ready']", timeout=180000)
    cells = [c.text_content() for c in ready.query_selector_all("td")]
    assert cells[2] == "tensor", cells
    assert all(n in cells[3] for n in nodes), cells
    instance = ready.get_attribute("data-instance")
    step(f"loaded {instance}: {cells[:5]}")
    shot("models")

    chat_metrics_reload()

    # 6. A node dies.
    if args.kill_pid:
        page.click("nav a[data-view='cluster']")
        # A forced tensor placement the planner predicted slower than the alternative when it
        # placed it: the feed says the link is too slow (only clear cases are judged).
        placed = considered(page, instance)
        step(f"placed with {placed}")
        assert "tensor" in placed and len(placed) > 1, placed
        best_other = max(v for k, v in placed.items() if k != "tensor")
        if placed["tensor"] < 0.8 * best_other:
            deadline = time.monotonic() + 5
            while slow_events(page) <= slow_before:
                assert time.monotonic() < deadline, "no too-slow-link event"
                time.sleep(0.1)
            page.wait_for_selector(slow, timeout=5000)
            step("event: " + page.text_content(slow))
        elif placed["tensor"] > 1.2 * best_other:
            time.sleep(1)
            assert slow_events(page) == slow_before, page.text_content(slow)
        step(f"predicted {predicted}")
        page.wait_for_selector(f".node-card.up[data-node='{args.kill_node}']")
        epoch = int(page.get_attribute(f"#cluster-instances tr[data-instance='{instance}']", "data-epoch"))
        killed = True
        t = time.monotonic()
        os.kill(args.kill_pid, signal.SIGKILL)
        page.wait_for_selector(f".node-card.gone[data-node='{args.kill_node}']", timeout=2000)
        page.wait_for_selector(f"#graph g.node.gone[data-node='{args.kill_node}']", timeout=2000)
        red = time.monotonic() - t
        step(f"killed node shown red after {red * 1000:.0f} ms")
        states = set()
        t = time.monotonic()
        while time.monotonic() - t < 60:
            row = page.query_selector(f"#cluster-instances tr[data-instance='{instance}']")
            if row:
                states.add(row.get_attribute("data-state"))
                if row.get_attribute("data-state") == "ready" and args.kill_node not in row.text_content():
                    break
            time.sleep(0.05)
        step(f"instance states after the kill: {sorted(states)}, epoch {epoch} -> {row.get_attribute('data-epoch') if row else '?'}")
        assert row and row.get_attribute("data-state") == "ready", "the instance was not placed again"
        # Shown re-placing while it was (a fast re-placement can fall between two polls: then
        # the new epoch says it happened).
        assert "re-placing" in states or int(row.get_attribute("data-epoch")) > epoch, states
        shot("cluster-node-gone")
        bad = [e for e in late_errors if "Failed to load resource" not in e]
        assert not bad, bad

    assert not errors, f"console errors: {errors}"
    browser.close()
step("ok")
