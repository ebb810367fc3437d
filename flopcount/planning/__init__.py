"""The plan reading: :func:`plan` of FSDP/TP training per rank in a fake world (world.py), its
TP plans as data (tp_mha.py, tp_conv1d.py), one recorded step (step.py) and the result."""

from flopcount.planning.plan import plan
from flopcount.planning.result import PlanResult

__all__ = ["PlanResult", "plan"]
