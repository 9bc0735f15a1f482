"""The package as users get it: the sdist and the wheel build and pass ``twine check``, their metadata is complete,
and the wheel installed into a fresh virtual environment runs the command and the library outside the repository.

The fresh environment does not download torch and the other dependencies again: a ``.pth`` line in its
site-packages appends this environment's site-packages to its path. Python processes the ``.pth`` files of the
site-packages directories only, not those of a directory listed in a ``.pth`` line, so the editable install's finder
(itself a ``.pth`` file here) stays out, and ``torchmetrics_retrieval`` can only come from the installed wheel.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from trove_classifiers import classifiers as known_classifiers

from tests.test_cli import digits_ranking

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: What the copy of the checkout that is built leaves out: git's and the local tools' files, earlier builds.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "*.egg-info", "__pycache__", "build", "dist", "site", ".*_cache", ".hypothesis"
)
#: The subprocesses' environment: without PYTHONPATH, which would put a source tree on the fresh environment's path.
ENVIRONMENT = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
#: What the wheel's command runs: the digits with a few metrics (the full demo adds seconds, not coverage).
DEMO = ["demo", "--quiet", "--json", "--cmc", "1", "5", "--no-map-full", "--no-clustering", "--fmr", "--pcf"]
#: The library's main call in the fresh environment; prints where the package came from and one value.
LIBRARY_CALL = """
import json, sys
import torch
from sklearn.datasets import load_digits

import torchmetrics_retrieval
from torchmetrics_retrieval.functional import retrieval_metrics

digits = load_digits()
metrics = retrieval_metrics(torch.from_numpy(digits.data).float(), torch.from_numpy(digits.target), cmc_top_k=(1,))
print(json.dumps({
    "file": torchmetrics_retrieval.__file__,
    "editable": sorted(name for name in sys.modules if name.startswith("__editable__")),
    "cmc/1": float(metrics["cmc/1"]),
}))
"""


def run(*command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=ENVIRONMENT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(wheel, sdist)``, the wheel built from the sdist (``python -m build``'s default), as a release is."""
    folder = tmp_path_factory.mktemp("build")
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)  # the build writes its egg-info beside pyproject.toml
    # --no-isolation: the build backend of this environment (a declared test dependency), no download; run from
    # the temporary folder, where no build/ directory can stand in for the build package
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", folder / "dist", source, cwd=folder)
    (wheel,) = (folder / "dist").glob("*.whl")
    (sdist,) = (folder / "dist").glob("*.tar.gz")
    return wheel, sdist


def wheel_metadata(wheel: Path) -> tuple[Message, list[str]]:
    """The wheel's METADATA, parsed as the email headers it is, and the names of the wheel's files."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(metadata).decode()), names


def test_twine_check_passes(dists: tuple[Path, Path]) -> None:
    done = run(sys.executable, "-m", "twine", "check", "--strict", *dists)
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_wheel_holds_the_package_its_license_and_the_command(dists: tuple[Path, Path]) -> None:
    wheel, sdist = dists
    _, names = wheel_metadata(wheel)
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "torchmetrics_retrieval").rglob("*.py")}
    assert sources <= set(names)  # every module, including subpackages
    assert "torchmetrics_retrieval/py.typed" in names
    with zipfile.ZipFile(wheel) as archive:
        (license_file,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_file) == (ROOT / "LICENSE").read_bytes()
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        commands = configparser.ConfigParser()
        commands.read_string(archive.read(entry_points).decode())
    assert dict(commands["console_scripts"]) == {"torchmetrics-retrieval": "torchmetrics_retrieval.cli:main"}
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "torchmetrics_retrieval/py.typed"} | sources <= in_sdist


def test_license_is_the_apache_license_2_0() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # the whole text: all nine sections of the terms, their end, and the appendix on applying the license
    assert "9. Accepting Warranty or Additional Liability." in text and "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    assert len(text.split()) > 1500


def test_wheel_metadata_is_complete(dists: tuple[Path, Path]) -> None:
    metadata, _ = wheel_metadata(dists[0])
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert str(metadata.get_payload()).startswith("# torchmetrics-retrieval")  # the README as the long description
    classifiers = metadata.get_all("Classifier", [])
    assert classifiers and not set(classifiers) - known_classifiers  # PyPI refuses an unknown classifier
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # License-Expression replaces them
    oldest = metadata["Requires-Python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {oldest}" in classifiers
    urls = {label: url for label, url in (entry.split(", ", 1) for entry in metadata.get_all("Project-URL", []))}
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
    assert "retrieval" in metadata["Keywords"].split(",")


def test_installed_wheel_runs_outside_the_repository(dists: tuple[Path, Path], tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    paths = json.loads(run(python, "-c", "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))").stdout)
    # The wheel is installed before the .pth line exists: pip then sees an empty environment, not this one's
    # editable install (which it could try to replace).
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", dists[0])
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))  # the dependencies
    (Path(paths["purelib"]) / "test_environment.pth").write_text("".join(f"{path}\n" for path in ours))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    call = json.loads(run(python, "-c", LIBRARY_CALL, cwd=elsewhere).stdout)
    package = Path(call["file"]).parent
    assert package == Path(paths["purelib"]) / "torchmetrics_retrieval"  # not the checkout, not the editable path
    assert call["editable"] == []  # the editable install's finder was not loaded
    assert (package / "py.typed").is_file()

    command = Path(paths["scripts"]) / "torchmetrics-retrieval"
    demo = run(command, *DEMO, cwd=elsewhere)
    assert demo.stderr == ""  # --quiet
    metrics = json.loads(demo.stdout)
    assert sorted(metrics) == ["cmc/1", "cmc/5", "map/5", "map_at_r", "mrr", "precision/5", "r_precision"]
    _, _, _, relevant = digits_ranking()  # the independent ranking (scipy distances, stable sort)
    assert metrics["cmc/1"] == pytest.approx(relevant[:, 0].mean(), abs=1e-6)
    assert call["cmc/1"] == pytest.approx(metrics["cmc/1"], abs=1e-6)
