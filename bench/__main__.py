"""`python -m bench`: the batcher against its peers (see bench/harness.py)."""

from bench.harness import main

main()
