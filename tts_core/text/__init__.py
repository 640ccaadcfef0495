"""The text a voice is given: the front end (normalization, SSML, markup), chunks and words, the operator's lexicon,
pronunciations, and captions (word times mapped back to the input)."""
