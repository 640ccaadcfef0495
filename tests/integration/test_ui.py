import httpx
from gradio_client import Client

from tests.audio_check import decode
from tests.serve import require_tools


def test_page_loads(server):
    page = httpx.get(f"{server}/")
    assert page.status_code == 200 and "gradio" in page.text.lower()


def test_synthesis_streams_each_sentence_then_offers_the_whole_file(server):
    require_tools("ffmpeg", install="apt-get install ffmpeg")  # Gradio's streaming player encodes with it
    client = Client(f"{server}/", verbose=False)
    job = client.submit("Hello from the browser tab. A second sentence follows. And then a third one.",
                        "en_US-joe-medium", 1.0, "wav", api_name="/synthesize")
    job.result(timeout=60)
    updates = job.outputs()
    streamed = [player for player, _ in updates[:-1]]
    # One update per piece: each sentence, the first one cut short so it starts sooner.
    assert len(streamed) >= 3 and all(str(chunk).endswith(".m3u8") for chunk in streamed)
    with open(updates[-1][1], "rb") as file:
        samples, rate = decode(file.read(), "wav")
    assert rate == 22050 and 2.5 < samples.size / rate < 9
