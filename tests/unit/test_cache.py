from tts_core.audio.cache import AudioCache, CachedAudio


def entry(size: int) -> CachedAudio:
    return CachedAudio(b"x" * size, "audio/wav", "v", 1.0)


def test_least_recently_used_goes_first_within_the_byte_budget():
    cache = AudioCache(max_bytes=300)
    cache.put("a", entry(100))
    cache.put("b", entry(100))
    cache.put("c", entry(100))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", entry(100))
    assert cache.get("b") is None and cache.get("a") and cache.get("c") and cache.get("d")
    assert cache.bytes == 300


def test_too_large_entries_are_not_cached_and_resize_evicts():
    cache = AudioCache(max_bytes=100)
    cache.put("big", entry(101))
    assert len(cache) == 0
    cache.put("a", entry(60))
    cache.resize(50)
    assert len(cache) == 0 and cache.bytes == 0


def test_hit_rate():
    cache = AudioCache(1000)
    cache.put("a", entry(10))
    cache.get("a"), cache.get("b")
    assert cache.stats()["hit_rate"] == 0.5
