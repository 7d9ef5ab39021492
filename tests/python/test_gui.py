"""The web GUI (Note [Web GUI] in search_daemon/daemon/gui_api.cc) against a daemon running a real
CPU search: templates and an LLM (a scripted OpenAI-compatible server in this process whose first
answer does not compile and whose repair does) propose, a real kforge-worker evaluates, and the
hooked model of test_daemon.py supplies the softmax signature.

1. The HTTP API: the GUI's files, /api/searches, /api/tree, /api/candidate and /api/events (the
   daemon's events as server-sent events, resumable by number), /api/cache and its actions
   (401 without the token, 403 with a wrong one, taking effect with it); malformed, unknown and
   oversized requests get 4xx answers and the daemon keeps serving; a non-loopback listener is
   refused.
2. A browser (Debian's headless Chromium, driven by Selenium): the overview lists the signature,
   the tree grows as evaluations finish, clicking the failed node shows its compile log, the
   repair's page shows its diff against the failed kernel, the cache page refuses an action
   without the daemon's token and carries it out with it. Each page's screenshot goes to
   <build>/gui-screenshots/.
Synchronization: the daemon's own documents, polled with deadlines.
"""
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from test_daemon import (Daemon, LLM_PLAN, LLM_SOURCE, daemon_bin, hook_path, private_root,  # noqa: F401
                         send_kernel_answer, start_model)

BROKEN_SOURCE = LLM_SOURCE.replace("double s = 0;", "double s = 0")   # a missing ';': a compile error


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, headers=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def post(port, path, token=None):
    """A POST with the GUI token header when given: (status, the answer's JSON; {} for an empty
    answer, as httplib gives for a path no route matches)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                 headers={"X-Kforge-Token": token} if token is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else {}


def get_json(port, path):
    status, _, body = get(port, path)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)


def wait_for(what, timeout, fn):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)   # the poll interval of a deadline-bound wait
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {str(last)[:2000]}")


class ModelServer:
    """An OpenAI-compatible server on a free loopback port; answer() says what each request gets."""

    def __init__(self):
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests += 1
                outer.answer(self, outer.requests)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


class ScriptedModel(ModelServer):
    """The first answer does not compile, every later one does."""

    def answer(self, handler, n):
        source = BROKEN_SOURCE if n == 1 else LLM_SOURCE.replace("double m", f"/* answer {n} */ double m")
        send_kernel_answer(handler, source, dict(LLM_PLAN, summary=f"one row per block (answer {n})"))


class SilentModel(ModelServer):
    """Holds every request until it is closed: a search whose only proposer is the LLM waits for
    it, searching, for as long as the test needs."""

    def __init__(self):
        self.release = threading.Event()
        super().__init__()

    def answer(self, handler, n):
        self.release.wait(600)
        handler.send_error(503)

    def close(self):
        self.release.set()
        super().close()


@pytest.fixture(scope="module")
def searching(daemon_bin, hook_path, tmp_path_factory):
    """A daemon with the GUI on, searching the model's softmax until the test ends."""
    tmp = tmp_path_factory.mktemp("gui")
    root = private_root(tmp)
    model_server = ScriptedModel()
    port = free_port()
    d = Daemon(daemon_bin, root, "--strategy", "mcts", "--max-evaluations", "40", "--set", "search.concurrent_searches=1",
               "--http", f"127.0.0.1:{port}", "--llm", "on", "--set", f"llm.base_url={model_server.url}",
               "--set", "llm.model=test")
    d.start()
    model = start_model(daemon_bin, hook_path, d, tmp, 400, "steady", KFORGE_TEST_GELU="0")
    try:
        searches = wait_for("the softmax search to start", 240,
                            lambda: [s for s in get_json(port, "/api/searches") if s.get("op") == "aten::_softmax"])
        yield {"daemon": d, "port": port, "id": searches[0]["id"], "model": model_server}
    finally:
        model.kill()
        model.wait()
        assert d.stop() == 0, d.log_text()
        model_server.close()


def test_the_gui_api_serves_files_trees_candidates_and_events_and_refuses_bad_requests(searching, daemon_bin, tmp_path):
    port, sid = searching["port"], searching["id"]
    status, ctype, body = get(port, "/gui/")
    assert status == 200 and ctype.startswith("text/html") and b"app.js" in body
    assert get(port, "/gui/app.js")[0] == 200
    assert get(port, "/gui/style.css")[1].startswith("text/css")
    # The event stream: from event 0, the search's events so far, numbered; resumable from a number.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("GET", "/api/events?since=0")
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    first = b""
    while b"\n\n" not in first:
        first += r.read1(65536)
    first = first.split(b"\n\n", 1)[0]
    assert first.startswith(b"id: 1\n") and b"data: {" in first, first
    event = json.loads(first.split(b"data: ", 1)[1])
    assert event["event"] in ("node", "result", "published", "finished") and "signature" in event
    conn.close()

    # The tree grows; its nodes carry what the GUI draws.
    tree = wait_for("three evaluated nodes", 300, lambda: (lambda t: t if t["evaluated"] >= 3 else None)(get_json(port, f"/api/tree/{sid}")))
    assert tree["id"] == sid and tree["nodes"][0]["status"] == "root"
    for n in tree["nodes"][1:]:
        assert {"id", "parent", "proposer", "label", "status", "visits", "mean_reward", "on_best_path"} <= n.keys()
    evaluated = [n for n in tree["nodes"][1:] if n["status"] not in ("pending", "in_flight")]
    c = get_json(port, f"/api/candidate/{sid}/{evaluated[0]['id']}")
    assert c["source"] and c["plan"]["launches"] and "outcome" in c and c["outcome"]["status"] == evaluated[0]["status"]
    # No secret: the daemon has none here, but nothing names the key variable's value or a CURVE key.
    assert "secret" not in json.dumps(c).lower()

    # Bad requests: 4xx, never a crash or a hang; the daemon keeps answering.
    assert get(port, f"/api/tree/{'0' * 32}")[0] == 404
    assert get(port, "/api/tree/not-an-id")[0] == 404
    assert get(port, f"/api/candidate/{sid}/999999")[0] == 404
    assert get(port, f"/api/candidate/{sid}/0")[0] == 404
    assert get(port, "/gui/../../etc/passwd")[0] == 404
    assert get(port, "/gui/nothere.js")[0] == 404
    assert get(port, "/api/events", headers={"Last-Event-ID": "x" * 40})[0] == 400
    big = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    big.request("POST", "/api/status", body=b"x" * (1 << 20))
    assert 400 <= big.getresponse().status < 500
    big.close()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:   # garbage instead of HTTP
        s.sendall(b"\x00\xff" * 4096 + b"\r\n\r\n")
        s.recv(4096)
    assert get(port, "/api/status")[0] == 200

    # The cache: the search's winner is listed; changing it needs the daemon's token.
    d = searching["daemon"]
    entry = wait_for("a published entry", 300, lambda: next((e for e in get_json(port, "/api/cache")["entries"]
                                                              if e["op"] == "aten::_softmax"), None))
    assert entry["state"] == "active" and entry["blobs"] and entry["bytes"] > 0 and entry["proposer"]
    token_file = d.root / "state" / "gui-token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text()

    def act(action, tok=None):
        return post(port, f"/api/cache/{entry['key']}/{action}", tok)
    status, body = act("disable")
    assert status == 401 and str(token_file) in body["error"] and token not in json.dumps(body)
    status, body = act("disable", "0" * len(token))
    assert status == 403 and token not in json.dumps(body)
    assert next(e for e in get_json(port, "/api/cache")["entries"] if e["key"] == entry["key"])["state"] == "active"
    assert act("explode", token)[0] == 400
    assert act("disable", token) == (200, {**act("disable", token)[1]})   # idempotent
    ls = subprocess.run([str(daemon_bin["kforge"]), "--cache-dir", str(d.root / "cache"), "cache", "ls", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert next(e for e in json.loads(ls.stdout)["entries"] if e["key"] == entry["key"])["state"] == "disabled", ls.stdout
    status, body = act("enable", token)
    assert status == 200 and body["state"] == "active"
    status, body = act("pin", token)
    assert status == 200 and body["pinned"] is True
    assert act("unpin", token)[1]["pinned"] is False
    assert get(port, f"/api/cache/{entry['key']}/disable")[0] == 404   # only POST changes anything
    assert entry["op_bytes"] > 0

    # Progress for the charts: the search's best over time, stepping up at its wins.
    prog = next(p for p in get_json(port, "/api/progress") if p["id"] == sid)
    assert prog["evaluated"] >= 3 and prog["points"], prog
    assert all(p["t_s"] is not None and p["t_s"] >= 0 for p in prog["points"])
    assert [p["speedup"] for p in prog["points"]] == sorted(p["speedup"] for p in prog["points"])
    assert prog["points"][-1]["speedup"] == max(p["speedup"] for p in prog["points"])

    # The hooked model loads the entry and says so in its reports: the status document shows it
    # per signature (its state and trial medians there) and per process (the estimate of time saved).
    def loaded():
        st = get_json(port, "/api/status")
        sig = next((x for x in st["signatures"] if x["id"] == sid), None)
        rows = [w for w in (sig or {}).get("in_process", []) if w["entry"] == entry["key"]]
        return (st, rows) if rows else None
    st, rows = wait_for("the model to report the entry it runs", 180, loaded)
    assert rows[0]["state"] in ("shadow", "active", "no_win", "disabled") and rows[0]["pid"] > 0, rows
    proc = next(p for p in st["processes"] if p["pid"] == rows[0]["pid"])
    assert sum(proc["kernels"].values()) >= 1 and proc["saved_ns"] >= 0, proc

    # A listener anyone could reach is refused at start-up, naming the key.
    r = subprocess.run([str(daemon_bin["kforged"]), "--http", "0.0.0.0:8123", "--state-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "daemon.http" in r.stderr and "127.0.0.1" in r.stderr, r.stderr


def browser():
    webdriver = pytest.importorskip("selenium.webdriver") if os.environ.get("CI") != "true" else __import__("selenium.webdriver").webdriver
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and chromium-driver are not installed (scripts/bootstrap.sh installs them)")
        pytest.skip("no chromium/chromedriver on this machine")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_a_browser_watches_the_search_and_audits_a_failed_candidate_and_its_repair(searching, build_dir):
    from selenium.webdriver.common.by import By
    port, sid = searching["port"], searching["id"]
    shots = build_dir / "gui-screenshots"
    shots.mkdir(exist_ok=True)
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    b = browser()
    try:
        # The page renders after its fetches return, and re-renders on every event of its view:
        # an element may not be there yet, or be replaced between finding and using it.
        def until(what, timeout, fn):
            def attempt():
                try:
                    return fn() or None
                except (NoSuchElementException, StaleElementReferenceException):
                    return None
            return wait_for(what, timeout, attempt)

        def click(what, css):
            def attempt():
                b.find_element(By.CSS_SELECTOR, css).click()
                return True
            until(what, 60, attempt)

        # Overview: the signature is listed, with a link to its tree.
        b.get(f"http://127.0.0.1:{port}/gui/")
        until("the overview to list the softmax", 60, lambda: "aten::_softmax" in b.find_element(By.ID, "signatures").text)
        until("the event stream to connect", 30, lambda: b.find_element(By.ID, "live").text == "live")
        b.save_screenshot(str(shots / "overview.png"))

        # The tree, live: it grows as evaluations finish, with no reload by the test.
        click("the search's link", f'#searches a[href="#/search/{sid}"]')
        until("the tree", 60, lambda: b.find_elements(By.CSS_SELECTOR, "#tree circle"))

        def evaluated():   # counted in the page, in one step: no element can go stale meanwhile
            return b.execute_script(
                "return [...document.querySelectorAll('#tree circle[data-status]')]"
                ".filter(c => !['root', 'pending', 'in_flight'].includes(c.dataset.status)).length")
        before = evaluated()
        until("the tree to grow", 300, lambda: evaluated() > before)
        # The LLM's first kernel does not compile: that node, and its repair, appear in time.
        until("a failed node", 300, lambda: b.find_elements(By.CSS_SELECTOR, '#tree circle[data-status="compile_error"]'))
        b.save_screenshot(str(shots / "tree.png"))

        failed_id = until("the failed node's id", 30, lambda: b.find_element(
            By.CSS_SELECTOR, '#tree circle[data-status="compile_error"]').get_attribute("data-node"))
        click("the failed node", f'#tree circle[data-node="{failed_id}"]')
        log = until("the compile log", 30, lambda: b.find_element(By.ID, "build-log").text)
        assert "error" in log.lower(), log
        b.save_screenshot(str(shots / "candidate-failed.png"))

        # The repair of that node: its page shows the diff against the kernel that failed.
        def repair():
            t = get_json(port, f"/api/tree/{sid}")
            return next((n for n in t["nodes"] if str(n["parent"]) == failed_id and n["proposer"] == "llm"), None)
        r = until("the repair of the failed node", 300, repair)
        b.get(f"http://127.0.0.1:{port}/gui/#/candidate/{sid}/{r['id']}")
        added = until("the diff", 30, lambda: [e.text for e in b.find_elements(By.CSS_SELECTOR, "#diff .add")])
        assert any("answer" in t or "double s = 0;" in t for t in added), added
        assert until("the diff's removed lines", 30, lambda: b.find_elements(By.CSS_SELECTOR, "#diff .del"))
        # Measured, its bandwidth against the copy bandwidth the worker measured.
        bw = until("the repair's bandwidth", 180, lambda: b.find_element(By.ID, "bandwidth").text)
        assert "GB/s" in bw and "of the copy bandwidth" in bw, bw
        b.save_screenshot(str(shots / "candidate-diff.png"))

        # The cache page: an action without the token is refused and says where the token is;
        # with it, it takes effect.
        b.get(f"http://127.0.0.1:{port}/gui/#/cache")
        key = until("the cache's softmax entry", 300, lambda: next(
            (r.get_attribute("data-key") for r in b.find_elements(By.CSS_SELECTOR, "#entries tr[data-key]") if "aten::_softmax" in r.text), None))

        def state():
            return b.find_element(By.CSS_SELECTOR, f'#entries tr[data-key="{key}"] .entry-state').text
        click("disable", f'#entries tr[data-key="{key}"] button[data-action="disable"]')
        until("the refusal", 30, lambda: "needs the token" in b.find_element(By.ID, "action-result").text)
        assert until("the state", 30, state).startswith("active")
        token = (searching["daemon"].root / "state" / "gui-token").read_text()

        def paste():
            field = b.find_element(By.ID, "token")
            field.clear()
            field.send_keys(token)
            b.execute_script("arguments[0].dispatchEvent(new Event('change'))", field)
            return b.execute_script("return sessionStorage.getItem('kforge-token')") == token
        until("the token pasted", 30, paste)
        click("disable", f'#entries tr[data-key="{key}"] button[data-action="disable"]')
        until("the entry disabled", 30, lambda: state().startswith("disabled"))
        b.save_screenshot(str(shots / "cache.png"))
        click("enable", f'#entries tr[data-key="{key}"] button[data-action="enable"]')
        until("the entry enabled again", 30, lambda: state().startswith("active"))
        # Where it runs: the model's process, as its reports say.
        until("the in-process column to name the model", 180, lambda: "pid " in b.find_element(
            By.CSS_SELECTOR, f'#entries tr[data-key="{key}"] .in-process').text)

        # Charts: the search's best speedup over time, and the active entry's bandwidth against
        # the copy bandwidth the CPU worker measured.
        b.get(f"http://127.0.0.1:{port}/gui/#/charts")
        until("the progress chart", 60, lambda: b.find_elements(By.CSS_SELECTOR, f'#progress-chart path.series[data-search="{sid}"]'))
        share = until("the roofline row", 60, lambda: b.find_element(By.CSS_SELECTOR, f'#roofline tr[data-key="{key}"]').text)
        assert "%" in share and "GB/s" in share, share
        b.save_screenshot(str(shots / "charts.png"))

        # The overview's processes: the model runs a kernel from the cache.
        b.get(f"http://127.0.0.1:{port}/gui/")
        until("the model's kernels on the overview", 60, lambda: any(
            "none" not in r.text for r in b.find_elements(By.CSS_SELECTOR, "#processes tr[data-pid]")))
        b.save_screenshot(str(shots / "overview-processes.png"))
    finally:
        b.quit()
    for name in ("overview", "tree", "candidate-failed", "candidate-diff", "cache", "charts", "overview-processes"):
        assert (shots / f"{name}.png").stat().st_size > 1000



def test_stopping_a_search_from_the_gui_needs_the_token_and_ends_it_for_good(daemon_bin, hook_path, tmp_path, build_dir):
    from selenium.webdriver.common.by import By
    root = private_root(tmp_path)
    silent = SilentModel()
    port = free_port()
    d = Daemon(daemon_bin, root, "--templates", "off", "--llm", "on", "--set", f"llm.base_url={silent.url}",
               "--set", "llm.model=test", "--http", f"127.0.0.1:{port}", "--set", "search.concurrent_searches=1")
    d.start()
    model = start_model(daemon_bin, hook_path, d, tmp_path, 400, "steady", KFORGE_TEST_GELU="0")
    b = None
    try:
        search = wait_for("the softmax search, waiting for the model", 240, lambda: next(
            (s for s in get_json(port, "/api/searches") if s.get("op") == "aten::_softmax" and not s["done"]), None))
        wait_for("the model to be asked", 120, lambda: silent.requests >= 1)
        sid = search["id"]
        token = (root / "state" / "gui-token").read_text()

        def stop(search_id, tok=None):
            return post(port, f"/api/search/{search_id}/stop", tok)
        status, body = stop(sid)
        assert status == 401 and "gui-token" in body["error"], body
        assert stop(sid, "f" * len(token))[0] == 403
        assert stop("0" * 32, token)[0] == 409   # no such search running
        assert stop(sid[:31], token)[0] == 404   # no route: an empty 404
        assert not next(s for s in get_json(port, "/api/searches") if s["id"] == sid)["done"]   # refused: still searching

        # The page's button, with the token pasted into the tab.
        b = browser()
        b.get(f"http://127.0.0.1:{port}/gui/#/search/{sid}")
        b.execute_script("sessionStorage.setItem('kforge-token', arguments[0])", token)
        b.get(f"http://127.0.0.1:{port}/gui/#/search/{sid}")
        b.refresh()
        button = wait_for("the stop button", 60, lambda: b.find_elements(By.ID, "stop-search"))
        button[0].click()
        wait_for("the page to say it stops", 30, lambda: "stopping" in b.find_element(By.ID, "action-result").text)
        shots = build_dir / "gui-screenshots"
        shots.mkdir(exist_ok=True)
        b.save_screenshot(str(shots / "search-stopping.png"))
        done = wait_for("the search to end", 60, lambda: next(
            (s for s in get_json(port, "/api/searches") if s["id"] == sid and s["done"]), None))
        assert done["done_reason"] == "stopped from the GUI", done
        assert stop(sid, token)[0] == 409   # nothing left to stop
        sig = wait_for("the signature's state to follow", 30, lambda: next(
            (s for s in get_json(port, "/api/status")["signatures"] if s["id"] == sid and "GUI" in s["note"]), None))
        # Done, not observed: the scheduler only starts observed signatures, and the journal says
        # done, so a restarted daemon does not resume it either.
        assert "stopped from the GUI" in sig["note"] and sig["state"] in ("done", "published"), sig
    finally:
        if b is not None:
            b.quit()
        model.kill()
        model.wait()
        silent.close()
        assert d.stop() == 0, d.log_text()
    assert "GUI: stop of the search of " + sid in d.log_text()
