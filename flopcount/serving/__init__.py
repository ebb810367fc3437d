"""The serving reading: :func:`serve`, bounds of ``generate()`` on a part (time to first
token, inter-token latency, tokens/s ceilings, KV capacity), priced from one count of the
model's own forwards (flopcount.decoding) with the one roofline function (flopcount.devices)."""

from flopcount.serving.figures import Phase, ServeBatch, ServeFacts, WeightTensor, Work
from flopcount.serving.result import LEAVES_OUT, ServeResult
from flopcount.serving.serve import DEFAULT_RESERVE, serve, serve_facts, serve_on

__all__ = ["DEFAULT_RESERVE", "LEAVES_OUT", "Phase", "ServeBatch", "ServeFacts", "ServeResult", "WeightTensor",
           "Work", "serve", "serve_facts", "serve_on"]
