"""A feature whose optional dependency is missing names the pip extra that installs it."""

import sys

import pytest

from lmsuite import extras


def test_a_missing_module_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"HF export needs `transformers` \(not installed\): "
                       r"pip install 'lmsuite\[hf\]'"):  # fmt: skip
        extras.require("transformers", feature="HF export")


def test_an_installed_module_is_returned_and_its_own_failures_pass_through(monkeypatch):
    assert extras.require("torch", feature="x").__name__ == "torch"

    def broken(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'sympy'", name="sympy")

    monkeypatch.setattr(extras.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="sympy"):  # not blamed on the extra
        extras.require("torch", feature="x")


def test_every_extra_named_exists_in_pyproject():
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRA_OF.values()) <= set(declared)
    with pytest.raises(ValueError, match="belongs to no lmsuite extra"):
        extras.install_hint("numpy")


def test_to_hf_without_transformers_names_the_extra(monkeypatch, tmp_path):
    from lmsuite.convert import to_hf
    from lmsuite.models import ModelConfig

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'lmsuite\[hf\]'"):
        to_hf(ModelConfig(architecture="encoder", vocab_size=8), {}, str(tmp_path))
