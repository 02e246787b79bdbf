"""Pure placement engine: stdlib and `better_compute.model` only; no I/O, clock or global random."""
