"""Dependencies point one way (docs/architecture.md): every import of the product's packages, read from their
source (relative and absolute, inside functions too), is checked against the layers. A wrong one is named as
"file:line -> module".

Inside tts_core a module imports its own layer and lower ones, never a higher one (LAYERS). tts_core imports no
other package of the repository and no web framework; storage imports nothing of the repository. The surfaces
(api, ui, admin) never import one another: what two of them share lives below them, in access/ (access control,
accounting), jobs/ and clones/, which import only tts_core and storage.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# tts_core's layers, lowest first; a module's layer is its longest prefix here.
LAYERS = {
    # 0: leaves
    "tts_core": 0, "tts_core.errors": 0, "tts_core.config": 0, "tts_core.validation": 0, "tts_core.ops": 0,
    "tts_core.scheduler.clock": 0,
    # 1: the text's front end and audio
    "tts_core.text": 1, "tts_core.audio": 1,
    # 2: the engines behind their contract
    "tts_core.engines": 2,
    # 3: the queue, policies, loops and strategies, and the queue's records
    "tts_core.scheduler": 3,
    # 4: a request (compiling, access, admission, dispatch, captions) and the voices
    "tts_core.request": 4, "tts_core.voices": 4,
    # 5: the service and the controllers beside it
    "tts_core.service": 5, "tts_core.monitor": 5, "tts_core.degrade": 5, "tts_core.controls": 5,
}
WEB_FRAMEWORKS = {"fastapi", "starlette", "gradio", "slowapi"}
SURFACES = {"api", "ui", "admin"}
SHARED_BELOW = {"access", "jobs", "clones"}  # below the surfaces, above tts_core and storage
# What each package may import of the repository's packages (the composition roots app.py, deploy/, bench/ and
# the tests may import anything).
ALLOWED = {
    "storage": {"storage"},
    "tts_core": {"tts_core"},
    **{package: {package, "tts_core", "storage"} for package in SHARED_BELOW},
    **{surface: {surface, "tts_core", "storage"} | SHARED_BELOW for surface in SURFACES},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, anywhere in it; `from package import module` names the
    module, a relative import is made absolute."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(above + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if is_module(submodule) else base))
    return list(dict.fromkeys(found))  # one entry for the names of one statement


def layer(module: str) -> int | None:
    prefixes = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return LAYERS[max(prefixes, key=len)] if prefixes else None


def violations(path: Path) -> list[tuple[str, int, str, str]]:
    """(file, line, module, why) for each import the layering forbids."""
    file = str(path.relative_to(ROOT))
    package = file.split("/")[0]
    own = layer(module_name(path)) if package == "tts_core" else None
    found = []
    for line, target in imports(path):
        top = target.split(".")[0]
        why = None
        if package == "tts_core" and top in WEB_FRAMEWORKS:
            why = "tts_core never imports a web framework"
        elif is_module(top) and package in ALLOWED and top not in ALLOWED[package]:
            why = f"{package} may import only {', '.join(sorted(ALLOWED[package]))}"
        elif own is not None and top == "tts_core" and layer(target) > own:
            why = f"layer {own} imports layer {layer(target)}"
        if why:
            found.append((file, line, target, why))
    return found


def checked_files() -> list[Path]:
    return [path for package in ALLOWED for path in sorted((ROOT / package).rglob("*.py"))]


def test_every_tts_core_module_has_a_layer():
    assert not [module_name(path) for path in (ROOT / "tts_core").rglob("*.py") if layer(module_name(path)) is None]


def test_the_check_names_an_import_up_a_layer_across_the_surfaces_or_to_a_web_framework(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for package in ("tts_core", "tts_core/text", "tts_core/request", "api", "ui"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "tts_core" / "request" / "script.py").write_text("")
    (tmp_path / "api" / "accounting.py").write_text("")
    words = tmp_path / "tts_core" / "text" / "words.py"
    words.write_text("import math\n\n\ndef late():\n    from ..request import script\n    from .. import errors\n"
                     "    import fastapi\n")
    speak = tmp_path / "ui" / "speak.py"
    speak.write_text("from tts_core.request import script\nfrom api.accounting import account\n")
    assert violations(words) == [("tts_core/text/words.py", 5, "tts_core.request.script", "layer 1 imports layer 4"),
                                 ("tts_core/text/words.py", 7, "fastapi", "tts_core never imports a web framework")]
    assert violations(speak) == [("ui/speak.py", 2, "api.accounting",
                                  "ui may import only access, clones, jobs, storage, tts_core, ui")]


def test_no_import_runs_up_a_layer_or_across_the_surfaces():
    found = [violation for path in checked_files() for violation in violations(path)]
    wrong = [f"{file}:{line} -> {target} ({why})" for file, line, target, why in found]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_module_imports_another_s_private_names():
    """What two modules share is public where it lives (the torch engines' helpers: tts_core/engines/torch_support.py),
    never a private name of one imported by the other."""
    found = [f"{path.relative_to(ROOT)}:{node.lineno} -> {node.module}.{alias.name}" for path in checked_files()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
             if isinstance(node, ast.ImportFrom) for alias in node.names if alias.name.startswith("_")]
    assert not found, "private names imported:\n" + "\n".join(found)


def test_the_settings_name_the_scheduler_s_policies_and_queue_orders():
    """The settings, a leaf, name what the scheduler above them holds (config cannot import it)."""
    from tts_core.config import BATCH_POLICIES, QUEUE_ORDERS
    from tts_core.scheduler.policy import POLICIES
    from tts_core.scheduler.queue import RequestQueue

    assert sorted(POLICIES) == sorted(BATCH_POLICIES)
    for order in QUEUE_ORDERS:
        RequestQueue(16, order=order)
