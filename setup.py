"""The build's one addition to setup.cfg: the hot path's optional C accelerators.

They are compiled when a C compiler and Python's headers are there; ``optional=True`` lets the
install go on without them, and the Python functions they speed up run instead (see
``tracetorch/engine/native.py``).
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tracetorch.engine._hotpath", ["tracetorch/engine/_hotpath.c"], optional=True),
    Extension("tracetorch.engine._binding", ["tracetorch/engine/_binding.c"], optional=True),
    Extension("tracetorch.adapters.torch._marks", ["tracetorch/adapters/torch/_marks.c"],
              optional=True),
])
