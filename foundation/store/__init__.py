"""The content-addressed store (paper §3–4): see store.py and docs/format.md."""

from foundation.store.cache import Tuning
from foundation.store.store import BlockType, Store

__all__ = ["BlockType", "Store", "Tuning"]
