"""Audio after the engine: made playable (joined, faded, resampled), encoded, and cached."""
