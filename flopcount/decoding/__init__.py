"""The forwards ``generate()`` runs (forwards.py: the options, the prefill call(s), each decode
step's inputs) and which decode steps are traced and which continued (runs.py). Shared by the
readings over generation (count_generation, serve)."""
