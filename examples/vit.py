"""Re-export of :mod:`flopcount.examples.vit` (the models ship with the package), kept so
``examples/vit.py:ATTR`` and ``from examples.vit import ...`` still work in the checkout."""

from flopcount.examples.vit import *  # noqa: F403
from flopcount.examples.vit import __all__  # noqa: F401
