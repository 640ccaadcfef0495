"""/docs (Swagger UI) and /redoc in a real headless Chromium that can reach no host but 127.0.0.1, as where a
self-hosted server has no internet: the pages render from the assets Chorus serves itself, and no request
leaves the browser for another host (its performance log lists every request, and those blocked before
they left)."""

import json
import shutil
from urllib.parse import urlsplit

import pytest

from bench.server import free_port, start_server
from tests.serve import require_tools

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("api-docs"), calibration_sizes="1")
    yield server.base_url
    server.stop()


@pytest.fixture(scope="module")
def offline_browser():
    """Headless Chromium for which every host but 127.0.0.1 does not exist (its names resolve to nothing and
    anything else goes to a proxy that is not there), logging every request it makes."""
    require_tools("chromium", "chromedriver", install="apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1900",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 f"--proxy-server=http://127.0.0.1:{free_port()}", "--proxy-bypass-list=127.0.0.1"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def requests_sent(browser) -> list[str]:
    """The URLs of the requests the browser sent or tried to send since the last call (its performance log is
    read once), those its page's policy would block before they left too: ReDoc's footer used to ask its
    maker's CDN for a logo."""
    events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    return [event["params"]["request"]["url"] for event in events if event["method"] == "Network.requestWillBeSent"]


def assert_only_chorus_asked(urls: list[str], server: str, asset: str) -> None:
    hosts = {urlsplit(url).netloc for url in urls if not url.startswith(("data:", "blob:"))}
    assert hosts == {urlsplit(server).netloc}, urls
    assert any(url.endswith(asset) for url in urls), urls  # its script came from Chorus


def test_swagger_ui_renders_the_operations_with_no_other_host_reachable(offline_browser, docs_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    offline_browser.get(docs_server + "/docs")
    WebDriverWait(offline_browser, 60).until(
        lambda driver: any("/v1/audio/speech" in block.text
                           for block in driver.find_elements(By.CSS_SELECTOR, ".opblock-post")))
    assert offline_browser.find_element(By.CSS_SELECTOR, ".info .title").text.startswith("Chorus")
    assert_only_chorus_asked(requests_sent(offline_browser), docs_server, "/swagger-ui-bundle.js")


def test_redoc_renders_the_operations_with_no_other_host_reachable(offline_browser, docs_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    offline_browser.get(docs_server + "/redoc")
    wait = WebDriverWait(offline_browser, 60)
    wait.until(lambda driver: any(heading.text.startswith("Chorus")
                                  for heading in driver.find_elements(By.TAG_NAME, "h1")))
    # the operations, in the side menu and as sections with their paths
    wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, ".menu-content li"))
    assert "/v1/audio/speech" in offline_browser.find_element(By.TAG_NAME, "body").get_attribute("textContent")
    assert_only_chorus_asked(requests_sent(offline_browser), docs_server, "/redoc.offline.js")
