"""Where limiter state lives: in process (:class:`MemoryStore`, the default) or
in Redis shared by many servers (:class:`RedisStore`, atomic Lua).  Both
implement :class:`Store` and decide identically for identical inputs."""

from ...errors import StoreError
from .base import Store, hash_key
from .lease import LeasedRedisStore
from .memory import MemoryStore
from .redis import RedisStore, limit_lua, load_lua

__all__ = ["LeasedRedisStore", "MemoryStore", "RedisStore", "Store", "StoreError", "hash_key", "limit_lua", "load_lua"]
