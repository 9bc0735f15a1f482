"""Public names: no module shadows a public function, and every path a user may take reaches the same object."""

import importlib
import inspect
import pkgutil
import subprocess
import sys
import types

import torchmetrics_retrieval
import torchmetrics_retrieval.functional as F


def all_submodules() -> list[types.ModuleType]:
    """Import every module of the package (the compiled kernels too), as a user's tooling might."""
    prefix = torchmetrics_retrieval.__name__ + "."
    names = [info.name for info in pkgutil.walk_packages(torchmetrics_retrieval.__path__, prefix)]
    return [importlib.import_module(name) for name in names if not name.endswith(".__main__")]  # (runs the CLI)


def test_no_public_name_is_shadowed_by_a_module() -> None:
    # Importing a submodule sets it as an attribute of its package: a module named like a public function
    # would replace the function (``import torchmetrics_retrieval.functional.knn`` once did).
    modules = all_submodules()
    packages = [torchmetrics_retrieval, *(m for m in modules if hasattr(m, "__path__"))]
    for package in packages:
        for name in getattr(package, "__all__", ()):
            value = getattr(package, name)
            assert not isinstance(value, types.ModuleType) or name in ("functional", "plotting"), (package, name)


def test_knn_is_the_function_however_it_is_reached() -> None:
    all_submodules()
    from torchmetrics_retrieval.functional import knn
    from torchmetrics_retrieval.functional.search import knn as knn_from_search

    assert inspect.isfunction(F.knn) and F.knn is knn is knn_from_search
    assert importlib.import_module("torchmetrics_retrieval.functional").knn is knn
    assert pkgutil.resolve_name("torchmetrics_retrieval.functional.knn") is knn  # dotted-path resolvers
    assert pkgutil.resolve_name("torchmetrics_retrieval.functional:knn") is knn
    assert callable(pkgutil.resolve_name("torchmetrics_retrieval.functional.knn"))


def test_knn_is_callable_in_a_fresh_interpreter_after_importing_its_module_path() -> None:
    # What users wrote before the module was removed, in a process where nothing else was imported first.
    code = (
        "import importlib, pkgutil, torch\n"
        "import torchmetrics_retrieval.functional.search\n"
        "import torchmetrics_retrieval.functional as F\n"
        "knn = pkgutil.resolve_name('torchmetrics_retrieval.functional.knn')\n"
        "print(knn(torch.tensor([[0.0], [1.0], [3.0]]), k=1).indices.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[[1], [0], [1]]"
