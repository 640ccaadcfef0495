"""A stand-in for spaCy's en_core_web_sm, for the benchmark's Kokoro-FastAPI peer on a machine that reaches only
the package registries: `python -m bench.spacy_stand_in OUT` writes OUT/en_core_web_sm-3.8.0.tar.gz.

misaki's English reader (which Kokoro-FastAPI uses) loads en_core_web_sm with its `tok2vec` and `tagger`, and
downloads it from spaCy's GitHub releases when it is not installed. This package has both: spaCy's English
tokenizer and a tagger trained here on four sentences tagged by a few rules. It is not spaCy's model: misaki
reads words from its own lexicons, and the tags only choose between a few homographs' pronunciations. Run it
with the peer's Python (spaCy installed), and install the file there.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "She read the book, then she wrote a letter.",
             "It costs five dollars today!", "Do you want to go to the park?"]
TAGS = {"the": "DT", "a": "DT", "she": "PRP", "you": "PRP", "it": "PRP", "to": "IN", "over": "IN", "then": "RB",
        "read": "VBD", "wrote": "VBD", "jumps": "VBZ", "costs": "VBZ", "do": "VBP", "want": "VB", "go": "VB"}


def build(out: Path) -> Path:
    import spacy
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("tok2vec")
    nlp.add_pipe("tagger")
    examples = []
    for text in SENTENCES:
        doc = nlp.make_doc(text)
        tags = ["." if token.is_punct else TAGS.get(token.lower_, "NN") for token in doc]
        examples.append(Example.from_dict(doc, {"tags": tags}))
    nlp.initialize(lambda: examples)
    rng = random.Random(0)
    for _ in range(20):
        rng.shuffle(examples)
        nlp.update(examples)
    nlp.meta.update(name="core_web_sm", version="3.8.0", description="a stand-in for Kokoro-FastAPI's benchmark "
                    "peer (bench/spacy_stand_in.py), not spaCy's model")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        nlp.to_disk(Path(scratch) / "pipeline")
        subprocess.run([sys.executable, "-m", "spacy", "package", str(Path(scratch) / "pipeline"), scratch,
                        "--name", "core_web_sm", "--version", "3.8.0", "--force"], check=True, capture_output=True)
        [made] = Path(scratch).glob("en_core_web_sm-3.8.0/dist/*.tar.gz")
        target = out / made.name
        target.write_bytes(made.read_bytes())
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.spacy_stand_in", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    print(build(parser.parse_args().out))
