"""Grab strategies: one module (or package) per strategy, the contract in base.py, the registry.

BUILTIN is the default of settings.REDPACK_STRATEGIES (name -> dotted path). This module imports
nothing, so that settings can read it before Django is set up.
"""

BUILTIN = {
    "pessimistic": "strategies.pessimistic.PessimisticStrategy",
    "distributed_lock": "strategies.distributed_lock.DistributedLockStrategy",
    "optimistic": "strategies.optimistic.OptimisticStrategy",
    "preallocated": "strategies.preallocated.PreallocatedStrategy",
    "preallocated_skip_locked": "strategies.preallocated_skip_locked.SkipLockedStrategy",
    "unsafe": "strategies.unsafe.UnsafeStrategy",
    "group_commit": "strategies.group_commit.GroupCommitStrategy",
    "redis_queue": "strategies.redis_queue.RedisQueueStrategy",
    "redis_queue_single": "strategies.redis_queue.RedisQueueSingleStrategy",
    "redis_counter": "strategies.redis_counter.RedisCounterStrategy",
    "redis_queue_async": "strategies.redis_queue_async.RedisQueueAsyncStrategy",
}
