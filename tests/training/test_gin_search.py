"""Where `--gin_file=NAME` is found: the working directory, then --gin_search_paths, then
lmsuite's own gin files (package data, so an installed wheel finds them from any folder)."""

import pathlib

from lmsuite import cli
from lmsuite.cli import model_config_from_gin

OWN = """include 'models/bert.gin'
ModelConfig.vocab_size = 512
ModelConfig.d_model = {d_model}
ModelConfig.num_heads = 2
ModelConfig.d_ff = 64
ModelConfig.num_layers = 1
"""


def test_the_gin_files_are_inside_the_package():
    package = pathlib.Path(cli.__file__).parents[1]
    assert pathlib.Path(cli.GIN_DIR) == package / "gin"
    assert (package / "gin" / "experiments" / "smoke.gin").is_file()


def test_the_users_own_folders_come_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_config_from_gin(["models/bert_tiny.gin"]).d_model == 64  # lmsuite's own
    mine = tmp_path / "mine" / "models"
    mine.mkdir(parents=True)
    (mine / "bert_tiny.gin").write_text(OWN.format(d_model=32))
    found = model_config_from_gin(["models/bert_tiny.gin"], search_paths=[str(mine.parent)])
    assert found.d_model == 32
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bert_tiny.gin").write_text(OWN.format(d_model=16))
    found = model_config_from_gin(["models/bert_tiny.gin"], search_paths=[str(mine.parent)])
    assert found.d_model == 16  # the working directory before everything


def test_a_missing_file_lists_every_folder_searched(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()  # (a search folder that does not exist is its own error)
    code = cli.main(["train", "--gin_file=experiments/nope.gin", "--model_dir=run",
                     f"--gin_search_paths={tmp_path / 'mine'}"])  # fmt: skip
    assert code == cli.CONFIG_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert "gin file 'experiments/nope.gin' not found in" in err
    for folder in (str(tmp_path), str(tmp_path / "mine"), str(cli.GIN_DIR)):
        assert repr(folder) in err
