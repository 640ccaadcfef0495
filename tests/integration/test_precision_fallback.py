"""A model whose batch fails at degrade mode's lower precision, on a real HTTP server: the caller gets its audio (the
batch ran again at full precision), the status and the Admin tab say lower precision is off for that model, and the
operator's reset lets degrade mode lower it again."""

import httpx
import pytest

from admin.state import state_markdown
from app import create_app
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings
from tts_core.request.operating import OperatorSettings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "test-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


class FailsLow(FakeEngine):
    """Raises at its lower precision, as VITS's flow did in fp16 on an H200."""

    low = False

    def set_low_precision(self, enabled: bool) -> bool:
        self.low = enabled
        return True

    def synthesize(self, batch):
        if self.low:
            raise ValueError("Discriminant has negative values")
        return super().synthesize(batch)


def test_lower_precision_that_fails_goes_back_to_full_is_shown_and_is_reset_by_the_operator(tmp_path):
    engine = FailsLow()
    settings = Settings(data_dir=tmp_path, admin_token=TOKEN, batch_policy="sequential", calibration_sizes=[1],
                        model_aliases={"quick": "fake"}, voice_aliases={})
    app = create_app(settings, engines=[engine])
    with serve_in_thread(app) as base:
        app.state.monitor.stop()  # the test, not the load, plays degrade mode's lower_precision action
        loop = app.state.service.loops["fake"]
        assert loop.set_low_precision(True).result(timeout=10) and engine.low
        answer = httpx.post(f"{base}/v1/audio/speech", timeout=30,
                            json={"model": "fake", "voice": "fake-voice", "input": "hello", "response_format": "wav"})
        assert answer.status_code == 200 and not engine.low
        stats = httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()
        off = stats["precision"]["fake"]
        assert off.startswith("full (lower precision off") and "ValueError" in off
        assert stats["status"]["engines"]["fake"]["precision"] == off
        assert httpx.get(f"{base}/api/v1/batch/status").json()["engines"]["fake"]["precision"] == off
        assert f"fake: {off}" in state_markdown(stats, OperatorSettings())  # the Admin tab's state text
        assert loop.set_low_precision(False).result(timeout=10) is not None
        assert loop.set_low_precision(True).result(timeout=10) is False and not engine.low  # it stays off

        reset = httpx.post(f"{base}/admin/api/models/fake/precision/reset", headers=ADMIN)
        assert reset.status_code == 200 and reset.json() == {"model": "fake", "was_off": True, "precision": "full"}
        assert loop.set_low_precision(False) is None  # already asked for: the reset asks anew
        assert loop.set_low_precision(True).result(timeout=10) is True and engine.low
        missing = httpx.post(f"{base}/admin/api/models/nope/precision/reset", headers=ADMIN)
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        assert "the models: fake, quick" in missing.json()["error"]["message"]  # the valid names, listed
        by_alias = httpx.post(f"{base}/admin/api/models/quick/precision/reset", headers=ADMIN)  # as /v1/models names it
        assert by_alias.status_code == 200 and by_alias.json()["model"] == "fake"
        assert httpx.post(f"{base}/admin/api/models/fake/precision/reset").status_code == 401
