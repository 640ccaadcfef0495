"""Every setting is a TTS_ variable the configuration page documents (the README points there for all of them)."""

from pathlib import Path

from tts_core.config import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_setting_has_its_row_on_the_configuration_page():
    page = PAGE.read_text()
    assert [name for name in Settings.model_fields if f"| `TTS_{name.upper()}` |" not in page] == []
