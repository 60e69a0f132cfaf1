"""The floors hold: `lint-imports` keeps every contract in pyproject.toml ([tool.importlinter])."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_no_import_breaks_a_layer_contract():
    # lint-imports analyses the `foundation` that its cwd holds: this tree, not an installed copy
    p = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                        "sys.exit(lint_imports_command())", "--no-cache"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 broken" in p.stdout and "BROKEN" not in p.stdout, p.stdout
