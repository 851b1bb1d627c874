"""`eurekamem ui` in a real headless Chromium (Debian's chromium and chromium-driver, driven by
selenium pointed at the system's browser and driver; nothing is downloaded): the printed link, a
search, a review approved, a memory forgotten and restored, the graph; a browser without the cookie,
one that reaches the page under another host name (DNS rebinding, by Chromium's resolver rules) and
a form sent without its CSRF token are refused.

Skips, saying why, where chromium or chromedriver is absent (`apt-get install chromium
chromium-driver`), unless EUREKAMEM_REQUIRE_BROWSER=1 (CI), which makes that an error. EUREKAMEM_UI_SCREENSHOTS=DIR keeps the pages' screenshots there (the README's
comes from bench/results/ui/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_process import DaemonProcess
from eurekamem.client import Client, NotFound

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    WHY = ("no system Chromium for the browser tests (apt-get install chromium chromium-driver): "
           f"chromium {CHROMIUM or 'missing'}, chromedriver {DRIVER or 'missing'}")
    if os.environ.get("EUREKAMEM_REQUIRE_BROWSER") == "1":  # CI, which installs them: fail, never skip
        raise RuntimeError(WHY)
    pytest.skip(WHY, allow_module_level=True)

from selenium import webdriver  # noqa: E402  (after the skip: selenium is of no use without the browser)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT = 30  # seconds a page may take to show what the test waits for
SECRET_TEXT = '<script>document.title="owned"</script><b>not bold</b>'


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Client, dict[str, str]]]:
    """A real daemon with a few memories, a pending review and a small graph; `eurekamem ui` on it.
    Yields the printed URL, a client and the ids the tests use."""
    root = Path(tempfile.mkdtemp(prefix="em-uib-"))
    daemon = DaemonProcess(root / "data", root / "s.sock").start()  # the default model, e5-small: it loads in ms
    env = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR")}
    env["EUREKAMEM_NO_AUTOSTART"] = "1"
    ui = None
    try:
        client = Client(str(daemon.socket_path))
        add = client.call
        median = add("memory.add", domain="bandit theory", category="pitfalls", title="Median of means for heavy tails",
                     content="Hoeffding needs bounded rewards; for heavy-tailed rewards use a median-of-means estimator.")
        add("memory.add", domain="bandit theory", category="proof_strategy", title="Peeling for anytime bounds",
            content="A peeling argument over doubling epochs gives anytime regret bounds.")
        marked = add("memory.add", domain="bandit theory", category="open_problems", title="Stored markup",
                     content=f"An agent wrote {SECRET_TEXT} here.")
        shared = add("memory.add", domain="bandit theory", category="proof_strategy", title="Doubling trick",
                     content="Restart the algorithm with twice the horizon to make it anytime.")
        review = add("memory.promote", id=shared["memory"]["id"], by="alice", reason="general technique")
        hoeffding = add("graph.add_theorem", theorem_name="Hoeffding", formal_statement="P(|X-EX|>t) <= 2exp(-2t^2/n)",
                        domain="concentration")
        azuma = add("graph.add_theorem", theorem_name="Azuma", formal_statement="martingale differences", domain="concentration")
        add("graph.link", from_id=azuma["node_id"], to_id=hoeffding["node_id"], relation="generalizes")
        more = {name: add("graph.add_theorem", theorem_name=name, formal_statement=f"{name}'s inequality",
                          domain="concentration")["node_id"] for name in ("Freedman", "Bernstein", "McDiarmid", "Chernoff")}
        add("graph.link", from_id=more["Freedman"], to_id=azuma["node_id"], relation="generalizes")
        add("graph.link", from_id=more["Bernstein"], to_id=hoeffding["node_id"], relation="specializes")
        add("graph.link", from_id=more["McDiarmid"], to_id=hoeffding["node_id"], relation="uses")
        add("graph.link", from_id=more["Chernoff"], to_id=more["Bernstein"], relation="contradicts")
        add("skills.put", name="wrong_lesson", body="# Wrong\nA lesson distilled wrongly.", status="draft", source="distilled")
        ui = subprocess.Popen(
            [sys.executable, "-m", "eurekamem.cli.main", "ui", "--socket", str(daemon.socket_path),
             "--data-dir", str(daemon.data_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        assert ui.stdout is not None
        line = ui.stdout.readline()
        assert "token=" in line, line
        url = line.split("open ", 1)[1].strip()
        yield url, client, {"median": median["memory"]["id"], "marked": marked["memory"]["id"],
                            "review": review["review_id"], "shared": shared["memory"]["id"], "azuma": azuma["node_id"]}
        client.close()
    finally:
        if ui is not None:
            ui.terminate()
            ui.wait(timeout=30)
        daemon.terminate()
        shutil.rmtree(root, ignore_errors=True)


def chromium(*arguments: str) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run", *arguments):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER)))


@pytest.fixture(scope="module")
def browser(served: tuple[str, Client, dict[str, str]]) -> Iterator[WebDriver]:
    driver = chromium()
    try:
        driver.get(served[0])  # the printed link: the token becomes the cookie, the page reloads without it
        WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.ID, "strip")))
        yield driver
    finally:
        driver.quit()


def base(url: str) -> str:
    return url.split("/?", 1)[0]


def shot(driver: WebDriver, name: str) -> None:
    folder = os.environ.get("EUREKAMEM_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def wait_text(driver: WebDriver, element_id: str, text: str) -> None:
    WebDriverWait(driver, WAIT).until(expected_conditions.text_to_be_present_in_element((By.ID, element_id), text))


def test_the_link_opens_the_page_and_a_search_finds_a_memory(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, _, ids = served
    assert browser.current_url.rstrip("/") == base(url)  # the token left the address bar
    assert "bandit theory" in browser.find_element(By.TAG_NAME, "main").text
    browser.get(base(url) + "/domain?name=bandit+theory")
    WebDriverWait(browser, WAIT).until(expected_conditions.presence_of_element_located((By.CLASS_NAME, "memories")))
    shot(browser, "domain")
    browser.get(base(url) + "/search")
    browser.find_element(By.ID, "q").send_keys("heavy-tailed rewards estimator")
    browser.find_element(By.ID, "go").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.presence_of_element_located((By.CLASS_NAME, "hit")))
    shot(browser, "search")
    first = browser.find_elements(By.CLASS_NAME, "hit")[0]
    assert first.text == "Median of means for heavy tails"
    assert "cosine" in browser.find_element(By.CLASS_NAME, "why").text
    first.click()
    wait_text(browser, "title", "Median of means for heavy tails")
    assert browser.current_url.endswith(f"/memory/{ids['median']}")


def test_stored_markup_is_text_in_the_browser(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, _, ids = served
    browser.get(f"{base(url)}/memory/{ids['marked']}")
    wait_text(browser, "content", SECRET_TEXT)  # the characters themselves, not a script or a bold element
    assert browser.title != "owned"
    assert not browser.find_elements(By.CSS_SELECTOR, "#content b, #content script")


def test_forget_and_restore_a_memory(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, client, ids = served
    browser.get(f"{base(url)}/memory/{ids['median']}")
    assert re.match(r"strong \(0\.\d\d\), fades in ~\d+ (years|months)", browser.find_element(By.ID, "strength").text)
    shot(browser, "memory")
    browser.find_element(By.ID, "forget").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.alert_is_present()).accept()  # our script asks first
    wait_text(browser, "status", "archived")
    assert client.call("memory.get", id=ids["median"])["status"] == "archived"
    browser.find_element(By.ID, "restore").click()
    wait_text(browser, "status", "active")
    assert "Restored." in browser.find_element(By.ID, "note").text
    assert client.call("memory.get", id=ids["median"])["status"] == "active"


def test_discard_a_draft_skill(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, client, _ = served
    browser.get(f"{base(url)}/skills")
    shot(browser, "skills")
    browser.find_element(By.CSS_SELECTOR, "#skill-wrong_lesson button.discard").click()
    WebDriverWait(browser, WAIT).until(expected_conditions.alert_is_present()).accept()  # it asks first: no undo
    wait_text(browser, "note", "Discarded")
    assert not browser.find_elements(By.ID, "skill-wrong_lesson")
    with pytest.raises(NotFound):
        client.call("skills.get", name="wrong_lesson")


def test_approve_a_review(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, client, ids = served
    browser.get(f"{base(url)}/review")
    card = browser.find_element(By.ID, f"review-{ids['review']}")
    assert "Doubling trick" in card.text and f"uid {os.getuid()}" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, "review")
    card.find_element(By.CLASS_NAME, "approve").click()
    wait_text(browser, "note", "Approved")
    assert client.call("memory.get", id=ids["shared"])["scope"] == "global"


def test_open_the_graph(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, _, ids = served
    browser.get(f"{base(url)}/graph?domain=concentration")
    svg = WebDriverWait(browser, WAIT).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#graph svg")))
    assert len(svg.find_elements(By.CSS_SELECTOR, "a.node")) == 6 and len(svg.find_elements(By.CSS_SELECTOR, "line.edge")) == 5
    browser.get(f"{base(url)}/graph?node={ids['azuma']}&depth=1")  # Azuma's neighbours: Hoeffding, Freedman
    svg = WebDriverWait(browser, WAIT).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#graph svg")))
    assert len(svg.find_elements(By.CSS_SELECTOR, "a.node")) == 3
    browser.get(f"{base(url)}/graph?domain=concentration")
    shot(browser, "graph")
    browser.get(f"{base(url)}/graph/node/{ids['azuma']}")
    assert "martingale differences" in browser.find_element(By.TAG_NAME, "main").text
    browser.get(f"{base(url)}/")
    shot(browser, "main")


def test_a_form_without_its_csrf_token_is_refused(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, client, ids = served
    browser.get(f"{base(url)}/memory/{ids['median']}")
    # what a forged form would send: the same action without the token (the browser adds the cookie)
    browser.execute_script(
        "var f = document.querySelector('form[action$=\"/pin\"]'); f.querySelector('input[name=csrf]').remove(); f.submit();"
    )
    WebDriverWait(browser, WAIT).until(lambda d: "CSRF" in d.find_element(By.TAG_NAME, "body").text)
    assert client.call("memory.get", id=ids["median"])["pinned"] is False


def test_another_browser_and_another_host_name_are_refused(served: tuple[str, Client, dict[str, str]], browser: WebDriver) -> None:
    url, _, _ = served  # `browser` opened the link already: its token is spent
    port = re.search(r":(\d+)/", url)
    assert port
    # evil.test resolves to 127.0.0.1 in this browser: a DNS-rebinding page reaching the server
    driver = chromium("--host-resolver-rules=MAP evil.test 127.0.0.1")
    try:
        driver.get(f"http://evil.test:{port.group(1)}/")
        assert "answers only as 127.0.0.1 or localhost" in driver.find_element(By.TAG_NAME, "body").text
        driver.get(f"{base(url)}/")  # no cookie in this browser, and the link's token is spent
        assert "one-time token" in driver.find_element(By.TAG_NAME, "body").text
        driver.get(url)
        assert "used already" in driver.find_element(By.TAG_NAME, "body").text
    finally:
        driver.quit()
