"""The surfaces (api/, ui/, admin/, jobs/) reach the service through its methods only: no `service.<part>.` chain
and no read of one of its parts (its settings, metrics, catalogue, cache, degrade controller...), which the surfaces
get from app.py or through SpeechService's read methods and ServiceControls instead."""

import ast
from pathlib import Path

import pytest

from tts_core.service import SpeechService

ROOT = Path(__file__).resolve().parents[2]
SURFACES = ("api", "ui", "admin", "jobs")
METHODS = {name for klass in SpeechService.__mro__ for name in vars(klass)}  # methods and properties, no parts


def _is_service(node: ast.expr) -> bool:
    """`service`, `….service` (self.service, request.app.state.service) or `_service(request)`."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Name) and node.id in ("service", "_service")) or \
        (isinstance(node, ast.Attribute) and node.attr in ("service", "_service"))


def reaches_in(source: str) -> list[str]:
    """Each place the code reaches into the service's parts, as `line: code`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        chained = isinstance(node.value, ast.Attribute) and _is_service(node.value.value)
        if chained or (_is_service(node.value) and node.attr not in METHODS):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_chains_parts_and_assignments_and_passes_methods():
    assert reaches_in("service.catalogue.resolve(voice)") == ["1: service.catalogue.resolve", "1: service.catalogue"]
    assert reaches_in("x = self.context.service.settings") == ["1: self.context.service.settings"]
    assert reaches_in("self.service.admission.lexicon = lexicon") == ["1: self.service.admission.lexicon",
                                                                      "1: self.service.admission"]
    assert reaches_in("_service(request).loops.items()") == ["1: _service(request).loops.items"]
    assert reaches_in("await service.answer(ask)\nservice.catalogue_now().resolve(voice)\nservice.ready") == []


@pytest.mark.parametrize("room", SURFACES)
def test_surfaces_reach_the_service_through_its_methods_only(room):
    found = {str(path.relative_to(ROOT)): places for path in sorted((ROOT / room).rglob("*.py"))
             if (places := reaches_in(path.read_text(encoding="utf-8")))}
    assert found == {}
