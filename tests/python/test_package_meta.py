"""The Python package as its ecosystem expects it (issue 27 item 5): python/pyproject.toml
is valid PEP 621 metadata whose version is the library's, and <build>/python (where CMake
copies it with the package, py.typed and the stubs) is a source tree pip turns into a
wheel offline (--no-build-isolation --no-index: no download)."""
import os
import re
import subprocess
import sys
import zipfile

import pytest

import layerstream

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_toml(path):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        pytest.skip("tomllib needs Python 3.11")
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_pyproject_metadata():
    meta = load_toml(os.path.join(ROOT, "python", "pyproject.toml"))
    project = meta["project"]
    assert project["name"] == "layerstream"
    cmake = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    version = re.search(r"project\(layerstream VERSION ([0-9.]+)", cmake).group(1)
    assert project["version"] == version == layerstream.__version__
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    assert set(meta["tool"]["setuptools"]["package-data"]["layerstream"]) >= {"py.typed", "*.pyi", "_C*.so"}


def test_wheel_builds_offline(tmp_path):
    build_python = os.path.dirname(os.path.dirname(os.path.abspath(layerstream.__file__)))
    if not os.path.exists(os.path.join(build_python, "pyproject.toml")):
        pytest.fail("%s has no pyproject.toml (python/CMakeLists.txt copies it)" % build_python)
    for mod in ("setuptools", "wheel", "pip"):
        try:
            __import__(mod)
        except ImportError:
            pytest.skip("%s is not installed for %s" % (mod, sys.executable))
    # A copy: pip writes build/ and *.egg-info next to the sources.
    import shutil
    src = tmp_path / "src"
    shutil.copytree(build_python, src, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps",
                        "-q", str(src), "-w", str(tmp_path / "dist")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list((tmp_path / "dist").glob("layerstream-*.whl"))
    assert len(wheels) == 1, wheels
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for want in ("layerstream/__init__.py", "layerstream/py.typed", "layerstream/_C.pyi"):
        assert want in names, sorted(names)
    assert any(re.match(r"layerstream/_C\..*\.so$", n) for n in names), sorted(names)
