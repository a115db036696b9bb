"""Build of the packet line's compiled core (netem/_linecore.c); the metadata is in
pyproject.toml. ``optional=True``: where there is no compiler the package still installs and
the line runs its pure-Python loop (netem/packetline.py says which engine ran)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("netem._linecore", ["netem/_linecore.c"],
                             extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
                             optional=True)])
