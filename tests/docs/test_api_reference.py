"""The docs/ site builds with its API reference generated from the docstrings (mkdocs with
mkdocstrings, `--strict`: a warning fails), and the reference covers the public API."""

import os
import re
import subprocess
import sys

import pytest

import specjax
import specjax.plots as plots
from tests.support import ROOT

pytest.importorskip("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("site"))
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "--site-dir", folder], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def _anchors(site: str, page: str) -> set[str]:
    with open(os.path.join(site, "reference", page, "index.html"), encoding="utf-8") as f:
        return set(re.findall(r'id="(specjax\.[\w.]+)"', f.read()))


def test_the_site_builds_strictly_and_documents_every_public_name(site):
    """Catches a reference page naming a module or object that no longer exists, a docstring
    the generator cannot read (a parameter documented that the signature lacks), a broken
    cross-reference, and a public name (`specjax.<name>`) missing from the reference."""
    api = _anchors(site, "api")
    missing = [name for name in specjax._API if f"specjax.api.{name}" not in api]
    assert not missing
    public_plots = [name for name, value in vars(plots).items()
                    if not name.startswith("_") and callable(value)
                    and getattr(value, "__module__", "") == "specjax.plots"]
    drawn = _anchors(site, "plots")
    assert public_plots and not [n for n in public_plots if f"specjax.plots.{n}" not in drawn]
    for page, module in (("drafters", "specjax.decoding.drafter.Drafter"),
                         ("layer_kinds", "specjax.nn.layer_kinds"),
                         ("training", "specjax.training.objective.Objective")):
        assert module in _anchors(site, page)
