"""The verified-key cache: entries expire, TTL 0 remembers nothing, the size stays bounded."""

import time

from api.keycache import KeyCache, TeamRef

TEAM = TeamRef("team-1", "one")


def test_entries_expire_after_the_ttl():
    cache = KeyCache(0.2)
    cache.put("d1", TEAM)
    assert cache.get("d1") == TEAM
    assert cache.get("d2") is None
    time.sleep(0.25)
    assert cache.get("d1") is None


def test_zero_ttl_remembers_nothing():
    cache = KeyCache(0)
    cache.put("d1", TEAM)
    assert cache.get("d1") is None


def test_size_is_bounded():
    cache = KeyCache(60, max_keys=3)
    for i in range(10):
        cache.put(f"d{i}", TEAM)
        assert len(cache._entries) <= 3
    assert cache.get("d9") == TEAM
