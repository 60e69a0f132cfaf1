"""The two implementations of foundation.native side by side: each test runs on both, and `other` is the one
it is not, so that a test can ask that both write the same bytes."""

import pytest

import foundation.native as N

IMPLS = {"native": N.native_impl, "reference": N.reference_impl}


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    if IMPLS[request.param] is None:
        pytest.skip("foundation._native is not built")
    return IMPLS[request.param]


@pytest.fixture
def other(impl):
    o = IMPLS["reference" if impl.name == "native" else "native"]
    if o is None:
        pytest.skip("foundation._native is not built")
    return o
