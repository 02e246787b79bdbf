"""The framework's floor for start-up: a Typer app with one command that prints a string.

benchmarks/run.py runs it with the same Python as `better-compute` and compares their wall times.
"""

import typer

app = typer.Typer(add_completion=False)


@app.command()
def hello() -> None:
    print("hello")


if __name__ == "__main__":
    app()
