"""Benchmarks: load generators and the peers Chorus is measured against."""
