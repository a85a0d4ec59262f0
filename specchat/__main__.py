"""`python -m specchat`: the same CLI as the `specchat` console script.

Why: the console script is missing wherever the venv's bin/ is not on PATH (or the package is run from
a checkout), and tests want to start the real CLI as a subprocess with `sys.executable -m specchat`,
which always uses the interpreter running them.
"""

from __future__ import annotations

from specchat.cli import app

if __name__ == "__main__":
    app(prog_name="specchat")
