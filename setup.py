# The C core is built by cffi at install time (see foundation/native/build.py).
from setuptools import setup

setup(cffi_modules=["foundation/native/build.py:ffibuilder"])
