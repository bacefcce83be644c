"""`codeyard bench ...`: the benchmark framework (`python -m benchmarks ...`) under the `codeyard`
command. A pass-through: every argument goes to the framework's own parser, so the two spellings
take the same options and print the same help.

The framework lives in the repository's `benchmarks/` folder, next to the installed packages in a
source checkout (an editable install, as `make install` makes); a wheel does not ship it.
"""

import sys
from importlib import import_module
from pathlib import Path
from typing import Annotated

import typer

REPO = Path(__file__).resolve().parent.parent

app = typer.Typer(add_completion=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def bench(args: Annotated[list[str] | None, typer.Argument(help="python -m benchmarks's arguments")] = None) -> None:
    """Run benchmark workloads, compare results with a baseline, gate CI, draw reports."""
    if not (REPO / "benchmarks" / "__main__.py").is_file():
        raise ValueError(f"codeyard bench runs from a source checkout: {REPO / 'benchmarks'} is missing")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    framework = import_module("benchmarks.__main__")  # the repository's scripts, outside mypy's packages
    code = framework.main(args or [], prog="codeyard bench")
    if code:
        raise typer.Exit(code)
