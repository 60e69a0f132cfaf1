"""The two implementations of foundation.native side by side: each test runs on both, and `other` is the one
it is not, so that a test can ask that both write the same bytes."""

import pytest

import foundation.native as N

IMPLS = {"native": N.native_impl, "reference": N.reference_impl}


def _built(name):
    assert IMPLS[name] is not None, "foundation._native is not built: run scripts/setup.sh (or foundation/native/build.py)"
    return IMPLS[name]


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return _built(request.param)


@pytest.fixture
def other(impl):
    return _built("reference" if impl.name == "native" else "native")
