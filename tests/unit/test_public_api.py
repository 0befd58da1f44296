"""The public classes of each method are importable from its package, and the packages import cheaply."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("package", ["insitu.lrt", "insitu.sparse", "insitu.e2train", "insitu.tt"])
def test_every_public_name_of_a_method_package_is_importable_from_it(package):
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(module, "nope")
    # dir() lists the lazy names beside the package's own (its docstring, its constants)
    assert set(module.__all__) | {"__doc__", "__name__"} <= set(dir(module))


def test_the_lrt_api_the_paper_names():
    from insitu.lrt import KroneckerSum
    from insitu.lrt.sks import KroneckerSum as defined

    assert KroneckerSum is defined


def test_importing_a_method_package_loads_none_of_its_modules():
    code = ("import sys, insitu.lrt, insitu.sparse, insitu.e2train; "
            "print(sorted(m for m in sys.modules if m.count('.') == 2 and m.split('.')[1] in "
            "('lrt', 'sparse', 'e2train')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
