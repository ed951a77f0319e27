"""The llmgw console in headless Chromium, against a running `llmgw dev`.

Run by crates/server/tests/console.rs:
    console_browser.py DEV_JSON SCREENSHOT_DIR

Prints one line per step; exits non-zero with the reason on the first
check that fails.
"""

import json
import os
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

DEADLINE = 60.0


def log(text):
    print(text, flush=True)


def wait_for(what, check, within=DEADLINE):
    started = time.monotonic()
    last = None
    while time.monotonic() - started < within:
        try:
            result = check()
            if result:
                log(f"  ok after {time.monotonic() - started:.1f}s: {what}")
                return result
        except Exception as error:  # a page mid-render
            last = error
        time.sleep(0.2)
    raise SystemExit(f"FAILED: {what} within {within}s (last error: {last})")


def retry_stale(action):
    """The page redraws its views on every event: an element found a moment
    ago may be gone; find it again, as a person would look again."""
    for _ in range(50):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.05)
    return action()


def click(driver, selector):
    retry_stale(lambda: driver.find_element(By.CSS_SELECTOR, selector).click())


def type_into(driver, element_id, text):
    def do():
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(text)
    retry_stale(do)


def admin(dev, token, method, url, body=None):
    """One admin API call over HTTPS, trusting the dev CA."""
    context = ssl.create_default_context(cafile=dev["ca"])
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return json.loads(response.read() or b"null")


def chat(router, model):
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    request = urllib.request.Request(router + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status == 200
    except urllib.error.URLError:
        return False


def main_text(driver):
    return driver.find_element(By.ID, "main").text


def main():
    dev_path, shots = sys.argv[1], sys.argv[2]
    dev = json.load(open(dev_path))
    tokens = {
        role: open(dev[f"{role}_token_file"]).read().strip() for role in ("read", "write")
    }
    servers = [p for p in dev["processes"] if p["role"] == "server"]

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1366,900",
                 # The dev CA is not in the browser's store.
                 "--ignore-certificate-errors"):
        options.add_argument(flag)
    # Debian's Chromium and its driver: nothing is downloaded.
    options.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        run(driver, dev, servers, tokens, shots)
    finally:
        driver.quit()


def leader_of(driver):
    text = main_text(driver)
    marker = "Leader: peer "
    if marker not in text:
        return None
    # "Leader: peer 2 (heard 40 ms ago), term 3."
    return int(text.split(marker, 1)[1].split()[0].rstrip(","))


def use_token(driver, token):
    type_into(driver, "token", token)
    click(driver, "#token-form button")


def run(driver, dev, servers, tokens, shots):
    # Open a follower's console: the leader is killed under it later.
    first = servers[0]["api"]
    driver.get(first + "/ui/#/cluster")
    wait_for("the console asks for a token", lambda: "needs a token" in main_text(driver))
    use_token(driver, tokens["write"])
    leader = wait_for("the cluster page names the leader", lambda: leader_of(driver))
    follower = next(p for p in servers if p["id"] != leader)
    driver.get(follower["api"] + "/ui/#/cluster")
    use_token(driver, tokens["write"])
    wait_for("a follower's console names the same leader", lambda: leader_of(driver) == leader)
    wait_for("every peer's state hash agrees", lambda: "all equal" in main_text(driver))
    driver.save_screenshot(os.path.join(shots, "cluster.png"))

    driver.get(follower["api"] + "/ui/#/nodes")
    wait_for("the nodes page lists the demo fleet",
             lambda: all(n in main_text(driver) for n in ("h100-1", "h100-2", "l40s-1", "a100-1")))
    driver.save_screenshot(os.path.join(shots, "nodes.png"))

    driver.get(follower["api"] + "/ui/#/models")
    wait_for("qwen-0.5b and llama-70b are ready",
             lambda: "qwen-0.5b\n1 of 1 replicas ready" in main_text(driver)
             and "llama-70b\n1 of 1 replicas ready" in main_text(driver))
    wait_for("each model shows its launch spec and a complete rollout",
             lambda: main_text(driver).count("rollout complete, 1 on this spec (1 ready), 0 on an earlier spec") == 2
             and "(current)" in main_text(driver))
    driver.save_screenshot(os.path.join(shots, "models.png"))

    # The page lives on while the leader dies: a marker set now survives
    # only if nothing reloads the page.
    driver.get(follower["api"] + "/ui/#/cluster")
    wait_for("the cluster page is back", lambda: leader_of(driver) == leader)
    driver.execute_script("window.llmgwMarker = 42;")
    pid = next(p["pid"] for p in servers if p["id"] == leader)
    os.kill(pid, signal.SIGKILL)
    log(f"  SIGKILL leader peer {leader} (pid {pid})")
    started = time.monotonic()
    wait_for("the open page shows a new leader", lambda: (leader_of(driver) or leader) != leader, within=30)
    log(f"NEW_LEADER_SHOWN_AFTER_S {time.monotonic() - started:.1f}")
    if driver.execute_script("return window.llmgwMarker;") != 42:
        raise SystemExit("FAILED: the page was reloaded")
    driver.save_screenshot(os.path.join(shots, "new-leader.png"))

    # A read token shows everything and changes nothing.
    use_token(driver, tokens["read"])
    driver.get(follower["api"] + "/ui/#/nodes/l40s-1")
    wait_for("the node page shows its GPU grid", lambda: "GPU 0" in main_text(driver))
    click(driver, "button[data-action='drain']")
    wait_for("a drain with the read token is refused",
             lambda: "drain refused: 403" in main_text(driver))
    driver.save_screenshot(os.path.join(shots, "read-token-refused.png"))

    # With the write token, drain the node that holds qwen-0.5b.
    use_token(driver, tokens["write"])
    driver.get(follower["api"] + "/ui/#/models")
    # Models are listed by name: qwen-0.5b's card is the last one.
    section = wait_for("qwen-0.5b's card is shown",
                       lambda: main_text(driver).split("qwen-0.5b", 1)[1])
    holder = next(n for n in ("l40s-1", "a100-1", "h100-1", "h100-2") if f"{n} GPUs" in section)
    driver.get(follower["api"] + f"/ui/#/nodes/{holder}")
    wait_for(f"{holder}'s page is shown", lambda: "GPU 0" in main_text(driver))
    type_into(driver, "deadline", "120")
    click(driver, "button[data-action='drain']")
    wait_for("the drain shows its progress", lambda: "Draining:" in main_text(driver))
    driver.save_screenshot(os.path.join(shots, "draining.png"))
    wait_for("the drain completes: no shard left, the node cordoned",
             lambda: "Draining: 0 shard(s)" in main_text(driver)
             or ("Cordoned." in main_text(driver) and "Draining" not in main_text(driver)),
             within=120)
    driver.get(follower["api"] + "/ui/#/models")
    wait_for("qwen-0.5b is ready elsewhere",
             lambda: "qwen-0.5b\n1 of 1 replicas ready" in main_text(driver)
             and f"{holder} GPUs" not in main_text(driver).split("qwen-0.5b", 1)[1])
    driver.save_screenshot(os.path.join(shots, "drained.png"))

    # Autoscale qwen-0.5b (sized so that it keeps one replica) and chat with
    # it: its page draws the load, the TTFT target and the replicas.
    model_url = follower["api"] + "/api/v1/models/qwen-0.5b"
    entry = admin(dev, tokens["write"], "GET", model_url)
    entry["autoscale"] = {"min_replicas": 1, "max_replicas": 2, "target_requests_per_replica": 50,
                          "ttft_p90_slo": "5s"}
    admin(dev, tokens["write"], "PUT", model_url, entry)
    # The router polls the control plane each second: it may still name
    # the drained replica for a moment.
    wait_for("the router sends qwen-0.5b to its new replica",
             lambda: chat(dev["router"], "qwen-0.5b"))
    answered = 0
    started = time.monotonic()
    while time.monotonic() - started < 8:
        answered += chat(dev["router"], "qwen-0.5b")
    log(f"  {answered} chats answered")
    wait_for("the peer sampled the chats",
             lambda: any((s["requests_per_s"] or 0) > 0
                         for s in admin(dev, tokens["write"], "GET", model_url + "/load")["samples"]))
    driver.get(follower["api"] + "/ui/#/models/qwen-0.5b")
    wait_for("the model page draws three charts with their series and the TTFT target",
             lambda: "Requests per second" in main_text(driver)
             and "Time to first token (p90)" in main_text(driver)
             and len(driver.find_elements(By.CSS_SELECTOR, "svg.chart polyline.series.s1")) >= 3
             and driver.find_elements(By.CSS_SELECTOR, "svg.chart line.target"))
    driver.save_screenshot(os.path.join(shots, "model-load.png"))

    # A key created in the console: its secret shown once, then revoked.
    driver.get(follower["api"] + "/ui/#/keys")
    wait_for("the keys page says there is none", lambda: "No API key yet" in main_text(driver))
    type_into(driver, "key-name", "console-ci")
    type_into(driver, "key-team", "web")
    type_into(driver, "key-rpm", "60")
    click(driver, "button[data-action='create-key']")
    wait_for("the secret is shown once", lambda: "shown this once: sk-llmgw-" in main_text(driver))
    wait_for("the key is listed live with its limit",
             lambda: "console-ci" in main_text(driver) and "60 req/min" in main_text(driver)
             and "live" in main_text(driver))
    driver.save_screenshot(os.path.join(shots, "keys.png"))
    click(driver, "button[data-action='revoke-key']")
    wait_for("the key is revoked", lambda: "Key console-ci revoked" in main_text(driver)
             and "revoked" in main_text(driver).split("console-ci", 2)[-1])
    log("CONSOLE_OK")


if __name__ == "__main__":
    main()
