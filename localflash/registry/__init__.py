"""Model pairs: ``models.toml`` (shipped + the user's) -> named target/drafter pairs, and ``models check``."""

from localflash.registry.pairs import Pair, get_pair, load_pairs

__all__ = ["Pair", "get_pair", "load_pairs"]
