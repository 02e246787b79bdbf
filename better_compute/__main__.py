"""`python -m better_compute`: the `better-compute` command, for a Python whose scripts directory
is not on PATH (a virtualenv not activated, `pipx run`, a CI image)."""

from better_compute.cli import main

main()
