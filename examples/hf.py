"""Re-export of :mod:`flopcount.examples.hf` (the models ship with the package), kept so
``examples/hf.py:ATTR`` and ``from examples.hf import ...`` still work in the checkout."""

from flopcount.examples.hf import *  # noqa: F403
from flopcount.examples.hf import __all__  # noqa: F401
