"""The one thing pyproject.toml does not declare: the optional C extension.

storage/_record_walk.c is the compiled record walk of produce validation
(storage/record_walk.py). Optional: a machine without a C compiler still installs, with the
pure-Python walk (same verdicts). Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("storage._record_walk", sources=["storage/_record_walk.c"],
                             extra_compile_args=["-O2"], optional=True)])
