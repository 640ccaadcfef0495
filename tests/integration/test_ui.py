import httpx
from gradio_client import Client

from tests.audio_check import decode


def test_page_loads(server):
    page = httpx.get(f"{server}/")
    assert page.status_code == 200 and "gradio" in page.text.lower()


def test_synthesis_endpoint_returns_audio(server):
    client = Client(f"{server}/", verbose=False)
    path = client.predict("Hello from the browser tab.", "en_US-joe-medium", 1.0, "wav", api_name="/synthesize")
    with open(path, "rb") as file:
        samples, rate = decode(file.read(), "wav")
    assert rate == 22050 and 0.8 < samples.size / rate < 4
