"""The counting spine: a call's inputs and the model's facts, the handler registry, the byte
model (traffic), costing the event stream (analysis), the one ledger that books it, and the
result it publishes (FlopResult). Every reading builds on these; none of them imports a reading.

Kept free of imports so that ``flopcount.core.results`` loads without torch."""
