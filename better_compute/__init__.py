"""better-compute: book GPU capacity now, later, as gangs or as spot."""

#: The one place the version is written: pyproject.toml reads it (setuptools' `attr:`), and
#: `--version` prints it, so a source tree that was never installed, or an editable install
#: whose version moved since, tells the version of the code it runs.
__version__ = "0.1.0"
