from foundation.crypto.keys import Keys, create_key_file, load_key_file

__all__ = ["Keys", "create_key_file", "load_key_file"]
