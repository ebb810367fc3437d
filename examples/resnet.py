"""Re-export of :mod:`flopcount.examples.resnet` (the models ship with the package), kept so
``examples/resnet.py:ATTR`` and ``from examples.resnet import ...`` still work in the checkout."""

from flopcount.examples.resnet import *  # noqa: F403
from flopcount.examples.resnet import __all__  # noqa: F401
