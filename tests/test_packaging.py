"""Packaging: every package the code imports is declared where its feature is, and test-only ones only for tests."""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def imports(top):
    """Top-level names of every module imported by the .py files under top."""
    out = set()
    for d, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f)) as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        out.update(a.name.split(".")[0] for a in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.level == 0:
                        out.add(node.module.split(".")[0])
    helpers = {os.path.splitext(m)[0] for m in os.listdir(os.path.join(ROOT, "tests"))}   # tests/*.py, tests/lab/
    return out - set(sys.stdlib_module_names) - {"foundation", "tests"} - helpers


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def declared():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    name = lambda req: norm(re.match(r"[A-Za-z0-9_.-]+", req).group())  # noqa: E731
    groups = {"": {name(r) for r in project["dependencies"]}}
    groups.update((k, {name(r) for r in v}) for k, v in project["optional-dependencies"].items())
    return groups


def dists(module):
    found = importlib.metadata.packages_distributions().get(module)
    assert found, f"{module} is imported but not installed (scripts/setup.sh installs every extra)"
    return {norm(d) for d in found}


def test_every_imported_package_is_declared():
    groups = declared()
    runtime = set().union(*(v for k, v in groups.items() if k != "test"))
    for module in sorted(imports("foundation")):
        assert dists(module) & runtime, f"foundation imports {module} ({dists(module)}): not in pyproject"
    assert {"trio", "pyfuse3"} <= groups["fuse"] and {"boto3", "botocore"} <= groups["replica"]


def test_test_only_packages_are_in_the_test_extra():
    groups = declared()
    runtime = set().union(*(v for k, v in groups.items() if k != "test"))
    for module in sorted(imports("tests") - imports("foundation")):
        if module == "pytest":
            assert "pytest" in groups["test"]
            continue
        d = dists(module)
        assert d & groups["test"] or d & runtime, f"the tests import {module} ({d}): not in pyproject"
    for pkg in ("pyftpdlib", "pyopenssl"):
        assert pkg in groups["test"] and pkg not in runtime, pkg


def test_license_is_shipped():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("MIT License") and "Copyright (c) 2026 The Foundation authors" in text
    with open(os.path.join(ROOT, "MANIFEST.in")) as f:
        assert "include LICENSE" in f.read().splitlines()


def _base_python(env):
    return subprocess.run(["bash", "-c", ". scripts/venv.sh; base_python"], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_setup_makes_the_environment_from_the_distributions_python_not_a_shim_first_on_path(tmp_path):
    shim = tmp_path / "python3"   # a pyenv- or conda-like python3 first on PATH
    shim.write_text("#!/bin/sh\nexec /nonexistent \"$@\"\n")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{tmp_path}:{env.get('PATH', '/usr/bin:/bin')}"
    recent = os.access("/usr/bin/python3", os.X_OK) and subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]).returncode == 0
    want = "/usr/bin/python3" if recent else "python3"   # (an older system Python: PATH decides)
    assert _base_python(env) == want
    assert _base_python(dict(env, PYTHON="/opt/python3.12/bin/python3")) == "/opt/python3.12/bin/python3"
