"""The composition on top of everything: the CLI's server verbs (`up`, `api`, `worker`, `db`, `keys`),
the wiring of adapters into a worker (wiring.py) and the embedded PostgreSQL and GCS emulator a fresh
machine runs (embedded.py). Nothing imports this package; it imports whatever it wires."""
