"""Run folders: one run per folder, never overwritten, statuses recorded, comparison."""

import json

import pytest

from insitu.io import tomllib
from insitu.errors import UsageError
from insitu.harness import Interrupted
from insitu.runs import RunFolder, compare, differences

pytestmark = pytest.mark.unit

CONFIG = {"lr": 0.1, "samples": 100, "model": None, "seeds": (0, 1)}


def test_a_folder_holds_one_run_and_its_config_as_toml(tmp_path):
    folder = RunFolder(tmp_path / "r", "insitu train", CONFIG)
    with folder.running():
        folder.finish({"samples": 100, "accuracy": 0.5, "curve": [{"samples": 100, "loss": 1.0}]})
    assert tomllib.loads((tmp_path / "r" / "config.toml").read_text()) == {"lr": 0.1, "samples": 100,
                                                                            "seeds": [0, 1]}
    assert "run,samples,loss" in (tmp_path / "r" / "curve.csv").read_text()
    assert RunFolder(tmp_path / "r", "insitu train", CONFIG).resumed                 # the same run
    assert RunFolder(tmp_path / "r", "insitu train", {**CONFIG, "samples": 500}).resumed  # more budget
    with pytest.raises(UsageError, match=r"holds another run \(lr 0.1 there, 0.2 here\)"):
        RunFolder(tmp_path / "r", "insitu train", {**CONFIG, "lr": 0.2})
    with pytest.raises(UsageError, match="holds a run of `insitu train`, not `insitu tt train`"):
        RunFolder(tmp_path / "r", "insitu tt train", CONFIG)


def test_a_folder_of_other_files_or_a_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a run folder"):
        RunFolder(tmp_path, "insitu train", CONFIG)
    with pytest.raises(UsageError, match="is a file"):
        RunFolder(tmp_path / "notes.txt", "insitu train", CONFIG)


@pytest.mark.parametrize("error,status", [(Interrupted("SIGINT after 3 samples"), "interrupted"),
                                          (ValueError("boom"), "failed")])
def test_a_run_that_raises_is_recorded_as_such(tmp_path, error, status):
    folder = RunFolder(tmp_path, "insitu train", CONFIG)
    with pytest.raises(type(error)):
        with folder.running():
            raise error
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == status and record["message"] == str(error)


def test_a_finished_run_that_fails_when_run_again_keeps_its_figures(tmp_path):
    with RunFolder(tmp_path, "insitu train", CONFIG).running() as folder:
        folder.finish({"samples": 100, "accuracy": 0.9})
    rows = json.loads((tmp_path / "run.json").read_text())["rows"]
    with pytest.raises(ValueError):
        with RunFolder(tmp_path, "insitu train", CONFIG).running():
            raise ValueError("no board")
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "failed" and record["rows"] == rows and rows[0]["accuracy"] == 0.9


def test_compare_lists_every_row_and_the_options_that_differ(tmp_path):
    for name, lr in (("a", 0.1), ("b", 0.2)):
        folder = RunFolder(tmp_path / name, "insitu train", {**CONFIG, "lr": lr})
        folder.start()
        folder.finish([{"name": "x", "accuracy": lr}, {"name": "y", "online_accuracy": 2 * lr}])
    table = compare([tmp_path / "a", tmp_path / "b"])
    assert table["differing"] == ["lr"]
    assert [(r["run"], r["accuracy"]) for r in table["runs"]] == [("a/x", 0.1), ("a/y", 0.2),
                                                                   ("b/x", 0.2), ("b/y", 0.4)]


def test_differences_name_at_most_four_fields_and_defaults():
    assert differences({"a": None}, {"a": 1}) == "a default there, 1 here"
    many = differences({k: 0 for k in "abcdef"}, {k: 1 for k in "abcdef"})
    assert many.count("there") == 4 and many.endswith("; ...")
