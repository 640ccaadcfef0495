"""`python -m bench`: the batcher against its peers (bench/harness.py); `--soak MINUTES`: one server
under mixed traffic with an overload in the middle (bench/soak.py)."""

from bench.harness import main

main()
