"""Ceilings belong to the lab: the Redis strategies' own scripts are named here, and each one
takes the KEYS its strategy gives it."""

from redpack.lab.ceilings import STRATEGIES_LUA, STRATEGY_SCRIPTS
from strategies import registry
from strategies.redis_state import RedisStateStrategy


def test_every_redis_strategy_has_its_script_and_only_they_do():
    redis_strategies = {
        name for name in registry.names() if isinstance(registry.get(name), RedisStateStrategy)
    }
    assert set(STRATEGY_SCRIPTS) == redis_strategies


def test_each_script_exists_and_gets_its_strategys_keys():
    for name, (script, key_count, *rest) in STRATEGY_SCRIPTS.items():
        assert (STRATEGIES_LUA / script).exists()
        keys = rest[: int(key_count)]
        expected = registry.get(name).state_keys(12345)  # type: ignore[attr-defined]
        assert [k.replace("$activity", "12345") for k in keys] == expected
