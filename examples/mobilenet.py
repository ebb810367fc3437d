"""Re-export of :mod:`flopcount.examples.mobilenet` (the models ship with the package), kept so
``examples/mobilenet.py:ATTR`` and ``from examples.mobilenet import ...`` still work in the checkout."""

from flopcount.examples.mobilenet import *  # noqa: F403
from flopcount.examples.mobilenet import __all__  # noqa: F401
