"""Plain records: the equality and repr a dataclass gives, without importing `dataclasses`.

The one design decision: the records every command loads (the store's
headers, the config, the catalog's snapshots, a run's result) are plain
classes with an __init__ of their own and Fields for the rest. `dataclasses`
imports inspect, and with it ast, dis and tokenize, and each @dataclass
compiles its methods when its module is imported: ~10 ms of every command's
start, a night's included (benchmarks/README.md, wave 16). Records only
other commands load (gc, replicas, verify) stay dataclasses.
"""


class Fields:
    """== compares the type and every attribute; repr shows them; unhashable, as a dataclass is."""

    __hash__ = None

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return vars(self) == vars(other)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def _set(self, given):
        """Set the keyword arguments given, each a field the class holds a default for: any other
        name is a TypeError, as a dataclass's __init__ raises."""
        cls = type(self)
        for k, v in given.items():
            if not hasattr(cls, k) or callable(getattr(cls, k)):
                raise TypeError(f"{cls.__name__} has no setting {k!r}")
            setattr(self, k, v)
