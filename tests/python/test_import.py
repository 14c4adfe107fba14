"""`import layerstream` from the build tree in a fresh interpreter with a clean
environment (only PYTHONPATH): the extension finds liblayerstream through its rpath,
needs neither numpy nor torch to import, and exposes the API the contract names."""
import os
import subprocess
import sys


def test_import_clean_env():
    # -E ignores PYTHON* variables, so pass the path in sys.path explicitly instead.
    path = os.environ.get("LS_BUILD_PYTHON") or os.environ["PYTHONPATH"].split(os.pathsep)[0]
    code = ("import sys; sys.path.insert(0, %r); import layerstream; "
            "assert 'numpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); "
            "print(layerstream.__version__, layerstream.version()); "
            "names = ['Engine', 'Clip', 'Keyframe', 'Reference', 'Error', 'InvalidArgument', 'OutOfBudget']; "
            "missing = [n for n in names if not hasattr(layerstream, n)]; assert not missing, missing; "
            "assert issubclass(layerstream.OutOfBudget, layerstream.Error); "
            "assert layerstream._C.API_VERSION >= 2" % path)
    r = subprocess.run([sys.executable, "-E", "-s", "-c", code], capture_output=True, text=True, env={})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("0.1.0 layerstream 0.1.0"), r.stdout


def test_import_with_pythonpath_only():
    """What the README says: PYTHONPATH=<build>/python python3 -c "import layerstream"."""
    path = os.environ.get("LS_BUILD_PYTHON") or os.environ["PYTHONPATH"].split(os.pathsep)[0]
    r = subprocess.run([sys.executable, "-c", "import layerstream; e = layerstream.Engine(preset='tiny'); "
                        "print(e.info()['hidden'])"], capture_output=True, text=True, env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 0
