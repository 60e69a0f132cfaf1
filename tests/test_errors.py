"""Exit codes: every error class's code is registered once, shared only within its family, and documented."""

import importlib
import pathlib
import pkgutil
import re

import pytest

import foundation
from foundation.errors import CODES, FAILED, INTERRUPTED, SUCCESS, Error

OPERATION = pathlib.Path(__file__).resolve().parent.parent / "docs" / "operation.md"


def all_errors():
    for m in pkgutil.walk_packages(foundation.__path__, "foundation."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    todo, seen = [Error], []
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("foundation."):     # not the classes these tests make
                seen.append(sub)
    return seen


def documented():
    text = OPERATION.read_text()
    table = text[text.index("### Exit statuses"):]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", table, re.M)
    return {int(code): meaning.strip() for code, meaning in rows}


def test_a_code_is_shared_only_by_the_family_that_owns_it():
    classes = all_errors()
    assert len(classes) > 40
    for cls in classes:
        owner = CODES[cls.code]
        assert issubclass(cls, owner), f"{cls.__qualname__} has exit code {cls.code}, owned by {owner.__qualname__}"


def test_every_code_is_in_the_operation_guide_with_its_meaning():
    all_errors()
    docs = documented()
    assert set(docs) == set(CODES) | {SUCCESS, FAILED, INTERRUPTED}
    assert all(len(meaning) > 5 for meaning in docs.values()), docs


def test_an_unrelated_class_cannot_take_a_registered_code():
    with pytest.raises(TypeError, match="exit code 22 of .*Clash already belongs to foundation.errors.StoreFull"):
        class Clash(Error):
            code = 22
    with pytest.raises(TypeError, match="exit code 2 of .*Codeless already belongs to foundation.errors.UsageError"):
        class Codeless(Error):      # an error that forgets its code would share the usage error's
            pass
    assert CODES[22].__name__ == "StoreFull" and CODES[2].__name__ == "UsageError"


def test_a_subclass_shares_its_family_code():
    from foundation.errors import NotFound

    class Missing(NotFound):
        pass

    assert Missing.code == 30 and CODES[30] is NotFound
