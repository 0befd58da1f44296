"""insitu.measure.sweep: config checks, point keys, resumable runs, tables, CSV and heat maps.

The runs here use a toy function of this module (``run = "<module>:toy"``) so that they take
milliseconds; the LRT experiment itself runs in tests/system/test_cli_sweep.py.
"""

import csv
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

import insitu.lrt.sweep_points  # noqa: F401 - registers lrt.adapt, the experiment most configs here name
from insitu.errors import InsituError, UsageError
from insitu.measure import sweep
from insitu.measure.sweep import grid_points, load_config, parse_config, run_sweep

pytestmark = pytest.mark.unit

TOY = f"{__name__}:toy"


def toy(seed, a, b, mode="plain", scale=1.0):
    """A deterministic 'experiment': a seeded random draw plus the parameters."""
    fail = os.environ.get("SWEEP_TOY_FAIL")
    if fail == f"{a},{b}":
        raise RuntimeError(f"toy failure at a={a}, b={b}")
    if os.environ.get("SWEEP_TOY_INTERRUPT") == f"{a},{b}":
        raise KeyboardInterrupt
    rng = np.random.default_rng([seed, a, b])
    score = scale * (a * 10 + b) + float(rng.random()) + (0.5 if mode == "norm" else 0.0)
    return {"score": score, "nested": {"product": a * b}, "writes": int(a * b + seed),
            "label": mode}


def toy_config(**overrides):
    data = {"sweep": {"run": TOY, "seeds": [0, 1], "metrics": ["score", "nested.product"]},
            "fixed": {"scale": 2.0},
            "grid": {"a": [1, 2], "b": [3, 4, 5], "mode": ["plain", "norm"]}}
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    return parse_config(data, source="toy.toml")


# ------------------------------------------------------------------------------ configuration

@pytest.mark.parametrize("data,message", [
    ({"sweep": {"run": TOY, "metrics": ["score"]}, "grids": {}},
     "unknown key 'grids' in the top level; allowed: sweep, fixed, grid"),
    ({"sweep": {"run": TOY, "metrics": ["score"], "seed": [0]}},
     "unknown key 'seed' in [sweep]; allowed: name, run, seeds, metrics, heatmap"),
    ({"sweep": {"run": TOY, "metrics": ["score"]}, "fixed": {"a": 1, "c": 2}, "grid": {"b": [1]}},
     "unknown key 'c' in [fixed]"),
    ({"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy"]},
      "fixed": {"env": "control", "scheme": "lrt", "samples": 10}, "grid": {"lrr": [0.1]}},
     "unknown key 'lrr' in [grid] (lrt.adapt parameters); allowed: env, scheme, samples"),
])
def test_unknown_keys_are_usage_errors_naming_the_key_and_the_allowed_ones(data, message):
    with pytest.raises(UsageError, match="^toy.toml: ") as err:
        parse_config(data, source="toy.toml")
    assert message in str(err.value)
    assert err.value.exit_code == 2


def test_lrt_adapt_allows_its_run_and_config_parameters():
    config = parse_config({"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy", "nvm.total_writes"]},
                           "fixed": {"env": "control", "samples": 10, "rank": 2, "kappa_th": 0},
                           "grid": {"lr": [0.01], "dense_batch": [10, 100], "scheme": ["lrt"]}})
    allowed = config.experiment.allowed
    for name in ("env", "scheme", "samples", "arch", "dataset", "offline_samples", "lr",
                 "dense_batch", "conv_batch", "rank", "rho_min", "kappa_th"):
        assert name in allowed
    for name in ("checkpoint", "counts_out", "advance", "config", "seed"):
        assert name not in allowed
    assert config.heatmap == ("lr", "dense_batch") and config.panel_axes == ("scheme",)


@pytest.mark.parametrize("overrides,message", [
    ({"grid": {"a": []}}, "[grid] a must be a non-empty list"),
    ({"grid": {"a": [1, 1]}}, "[grid] a repeats a value"),
    ({"grid": {"a": [[1]]}}, "must be a string, number or boolean"),
    ({"grid": {"seed": [1, 2]}}, "'seed' in [grid]: list the seeds in [sweep] seeds"),
    ({"fixed": {"a": 1}}, "'a' is both in [fixed] and in [grid]"),
    ({"sweep": {"heatmap": ["a", "scale"]}}, "heatmap must name two different [grid] axes"),
    ({"sweep": {"seeds": [0, 0]}}, "seeds must be a count or a list of distinct integers"),
    ({"sweep": {"seeds": 0}}, "seeds as a count must be >= 1"),
    ({"sweep": {"metrics": []}}, "metrics must be a non-empty list"),
    ({"sweep": {"run": "no.such"}}, "unknown experiment 'no.such'"),
    ({"sweep": {"run": "insitu.nothing_here:f"}}, "cannot load the sweep function"),
])
def test_bad_values_are_usage_errors(overrides, message):
    with pytest.raises(UsageError) as err:
        toy_config(**overrides)
    assert message in str(err.value)


def test_lrt_adapt_needs_its_required_parameters_and_known_metrics():
    base = {"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy"]},
            "fixed": {"scheme": "lrt", "samples": 10}}
    with pytest.raises(UsageError, match="lrt.adapt needs env in"):
        parse_config(base)
    base["fixed"]["env"] = "control"
    base["sweep"]["metrics"] = ["accuracy"]
    with pytest.raises(UsageError, match="unknown metric 'accuracy'; lrt.adapt reports: online_accuracy"):
        parse_config(base)


def test_load_config_reads_toml_and_resolves_paths_from_its_folder(tmp_path):
    path = tmp_path / "sub" / "fig.toml"
    path.parent.mkdir()
    path.write_text('[sweep]\nrun = "lrt.adapt"\nseeds = 2\nmetrics = ["online_accuracy"]\n'
                    '[fixed]\nenv = "control"\nscheme = "lrt"\nsamples = 10\ncache_dir = "cache"\n'
                    '[grid]\nlr = [0.01, 0.1]\n')
    config = load_config(path)
    assert config.name == "fig" and config.seeds == (0, 1) and config.heatmap is None
    assert config.fixed["cache_dir"] == str(tmp_path / "sub" / "cache")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sweep\nrun = 1\n")
    with pytest.raises(UsageError, match="bad.toml is not valid TOML"):
        load_config(bad)


# ------------------------------------------------------------------------------------ points

def test_points_cover_the_grid_times_the_seeds_with_stable_distinct_keys():
    config = toy_config()
    points = grid_points(config)
    assert len(points) == 2 * 3 * 2 * 2
    assert len({p.key for p in points}) == len(points)
    assert [p.key for p in grid_points(toy_config())] == [p.key for p in points]
    first = points[0]
    assert first.axes == {"a": 1, "b": 3, "mode": "plain"} and first.seed == 0
    assert first.params == {"scale": 2.0, "a": 1, "b": 3, "mode": "plain"}
    assert first.key.startswith("a=1_b=3_mode=plain_seed=0_")
    # a changed fixed parameter is another result: other keys, nothing stale is reused
    other = grid_points(toy_config(fixed={"scale": 3.0}))
    assert not {p.key for p in other} & {p.key for p in points}


def test_a_cache_folder_does_not_change_the_keys():
    def keys(cache):
        return [p.key for p in grid_points(parse_config(
            {"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy"]},
             "fixed": {"env": "control", "scheme": "lrt", "samples": 10, "cache_dir": cache},
             "grid": {"lr": [0.01, 0.1]}}, base=None))]
    assert keys("/tmp/a") == keys("/tmp/b")


# ----------------------------------------------------------------------------------- running

def _run(config, out, **kwargs):
    return run_sweep(config, out, workers=kwargs.pop("workers", 1), **kwargs)


def test_sweep_writes_points_table_csv_and_heat_maps_then_resumes(tmp_path):
    config = toy_config()
    done = []
    summary = _run(config, tmp_path, advance=done.append)
    assert summary["points"] == summary["ran"] == 24 and summary["skipped"] == 0
    assert sum(done) == 24
    points = sorted((tmp_path / "points").glob("*.json"))
    assert len(points) == 24
    record = json.loads(points[0].read_text())
    assert set(record) >= {"key", "axes", "seed", "params", "result", "wall_s"}
    # the table: one row per grid point, the mean over seeds
    rows = summary["table"]
    assert len(rows) == 12
    row = next(r for r in rows if r["a"] == 2 and r["b"] == 4 and r["mode"] == "norm")
    expected = [toy(s, 2, 4, "norm", 2.0)["score"] for s in (0, 1)]
    assert row["seeds"] == [0, 1]
    assert row["score"] == pytest.approx(np.mean(expected))
    assert row["score_std"] == pytest.approx(np.std(expected))
    assert row["nested.product"] == 8
    assert json.loads((tmp_path / "sweep.json").read_text())["table"] == rows
    with open(tmp_path / "points.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 24 and list(table[0]) == ["a", "b", "mode", "seed", "score",
                                                   "nested.product", "wall_s", "key"]
    assert float(table[0]["score"]) == toy(0, 1, 3, "plain", 2.0)["score"]
    # heat maps: one per metric and per value of the axis that is not a heat-map axis
    names = sorted(os.path.basename(p) for p in summary["heatmaps"])
    assert names == ["heatmap-nested.product-mode=norm.png", "heatmap-nested.product-mode=plain.png",
                     "heatmap-score-mode=norm.png", "heatmap-score-mode=plain.png"]
    for p in summary["heatmaps"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # a rerun runs nothing and gives the same table
    again = _run(config, tmp_path)
    assert again["ran"] == 0 and again["skipped"] == 24 and again["table"] == rows
    # a lost point is run again, alone
    points[3].unlink()
    (tmp_path / "points" / points[5].name).write_text("{ not json")
    third = _run(config, tmp_path)
    assert third["ran"] == 2 and third["table"] == rows


def test_a_failed_point_keeps_the_finished_ones_and_a_rerun_resumes(tmp_path, monkeypatch):
    config = toy_config()
    monkeypatch.setenv("SWEEP_TOY_FAIL", "1,5")
    with pytest.raises(InsituError) as err:
        _run(config, tmp_path)
    message = str(err.value)
    assert "sweep point a=1_b=5_mode=plain_seed=0_" in message
    assert "RuntimeError: toy failure at a=1, b=5" in message
    assert "8 of 24 points are finished and kept" in message and "run the sweep again" in message
    assert len(list((tmp_path / "points").glob("*.json"))) == 8
    monkeypatch.delenv("SWEEP_TOY_FAIL")
    summary = _run(config, tmp_path)
    assert summary["ran"] == 16 and summary["skipped"] == 8
    assert summary["table"] == _run(config, tmp_path / "fresh")["table"]


def test_an_interrupted_sweep_keeps_what_finished(tmp_path, monkeypatch):
    config = toy_config()
    monkeypatch.setenv("SWEEP_TOY_INTERRUPT", "2,3")
    said = []
    with pytest.raises(KeyboardInterrupt):
        _run(config, tmp_path, log=said.append)
    assert len(list((tmp_path / "points").glob("*.json"))) == 12
    assert said == [f"interrupted: 12 of 24 points are finished and kept in {tmp_path / 'points'}; "
                    "run the sweep again to resume"]
    monkeypatch.delenv("SWEEP_TOY_INTERRUPT")
    assert _run(config, tmp_path)["ran"] == 12


def test_a_process_pool_gives_the_same_table_as_one_process(tmp_path):
    config = toy_config()
    one = _run(config, tmp_path / "one", workers=1)
    pool = _run(config, tmp_path / "pool", workers=2)
    assert pool["ran"] == 24 and pool["backend"] == "local"
    assert pool["table"] == one["table"]


def test_a_failure_in_a_worker_process_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_TOY_FAIL", "1,3")       # the workers inherit the environment
    with pytest.raises(InsituError, match="RuntimeError: toy failure at a=1, b=3"):
        _run(toy_config(), tmp_path, workers=2)


def test_a_metric_the_result_lacks_is_named_and_the_point_kept(tmp_path):
    config = toy_config(sweep={"metrics": ["score", "accuracy"]})
    with pytest.raises(InsituError, match="metric 'accuracy' is not in the result of point .*; "
                                          "it has: score, nested, writes"):
        _run(config, tmp_path)
    assert len(list((tmp_path / "points").glob("*.json"))) == 1
    with pytest.raises(InsituError, match="metric 'label' is not a number"):
        _run(toy_config(sweep={"metrics": ["label"]}), tmp_path / "label")


def test_ray_missing_is_a_clear_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    with pytest.raises(InsituError, match=r"pip install 'insitu\[ray\]'"):
        run_sweep(toy_config(), tmp_path, ray_address="127.0.0.1:1")
    assert not list((tmp_path / "points").glob("*.json"))


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (pip install 'insitu[ray]')")
def test_an_unreachable_ray_address_fails_at_once(tmp_path):
    with pytest.raises(InsituError, match="cannot reach the Ray cluster at 127.0.0.1:1: "):
        run_sweep(toy_config(), tmp_path, ray_address="127.0.0.1:1")


def test_bad_workers_and_bad_lrt_points_fail_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="--workers must be an integer >= 1"):
        run_sweep(toy_config(), tmp_path, workers=0)
    config = parse_config({"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy"]},
                           "fixed": {"env": "control", "scheme": "lrt", "samples": 10,
                                     "dataset": "digits", "arch": "mlp"},
                           "grid": {"rank": [2, 12]}}, source="bad.toml")
    with pytest.raises(UsageError, match="bad.toml: point rank=12: rank 12 is too large for layer fc2"):
        run_sweep(config, tmp_path / "lrt")
    assert not (tmp_path / "lrt").exists()
    config = parse_config({"sweep": {"run": "lrt.adapt", "metrics": ["online_accuracy"]},
                           "fixed": {"env": "mars", "scheme": "lrt", "samples": 10}})
    with pytest.raises(UsageError, match="env must be one of control, shift"):
        run_sweep(config, tmp_path / "lrt")


def test_unknown_experiment_function_must_take_a_seed():
    with pytest.raises(UsageError, match="must take a 'seed' keyword argument"):
        parse_config({"sweep": {"run": "insitu.io:check_writable", "metrics": ["x"]}})
    assert sweep.RAY_HINT == "pip install 'insitu[ray]'"


# ------------------------------------------------------------------------- command sweeps

def _fake_command(name="train"):
    """A Command as the CLI builds it from click, for an imaginary `insitu train`."""
    keys = {"samples": int, "batch-size": int, "lr": float, "seed": int, "data-dir": str,
            "out": str}
    options = {}
    for key in keys:
        options[key] = options[key.replace("-", "_")] = key
    options["batch"] = "batch-size"                      # an older, hidden spelling

    def cast(key, value):
        return keys[key](value)                          # int("x") raises the ValueError

    return sweep.Command(name=name, options=options, cast=cast, paths=("data-dir",),
                         refused={"out": "the point writes its outputs into its run folder"})


def command_config(**sections):
    data = {"sweep": {"command": "train", "metrics": ["accuracy"], "seeds": [0, 1]},
            "fixed": {"samples": 100}, "grid": {"lr": [0.01, 0.1], "batch_size": [16, 32]}}
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return parse_config(data, source="cmd.toml", base=None, commands=lambda name: _fake_command(name))


def test_a_command_sweep_checks_keys_against_the_command_and_keys_points_by_option():
    config = command_config()
    assert config.run is None and config.label == "insitu train"
    points = grid_points(config)
    assert len(points) == 8 and points[0].axes == {"lr": 0.01, "batch_size": 16}
    # a point's options are the command's config keys, whatever the spelling in the sweep
    assert sweep._command_options(config, points[0]) == {"samples": 100, "lr": 0.01, "batch-size": 16}
    same = parse_config({"sweep": {"command": "train", "metrics": ["accuracy"], "seeds": [0, 1]},
                         "fixed": {"samples": 100}, "grid": {"lr": [0.01, 0.1], "batch-size": [16, 32]}},
                        source="cmd.toml", commands=lambda name: _fake_command(name))
    assert [p.key.rsplit("_", 1)[1] for p in grid_points(same)] == \
        [p.key.rsplit("_", 1)[1] for p in points]                     # the same runs, the same hashes
    # where the data is does not change the result: not in the key
    moved = command_config(fixed={"data-dir": "/elsewhere"})
    assert [p.key for p in grid_points(moved)] == [p.key for p in points]


@pytest.mark.parametrize("sections,message", [
    ({"grid": {"lrr": [0.1]}}, "unknown key 'lrr' in [grid]: `insitu train` has no option --lrr; its options: "
                               "batch-size, data-dir, lr, samples"),
    ({"fixed": {"out": "x.json"}}, "'out' in [fixed]: the point writes its outputs into its run folder"),
    ({"fixed": {"seed": 1}}, "'seed' in [fixed]: list the seeds in [sweep] seeds"),
    ({"fixed": {"samples": "many"}}, "[fixed] samples = 'many': invalid literal"),
    ({"grid": {"lr": [0.1, "fast"]}}, "[grid] lr = 'fast': could not convert"),
    ({"fixed": {"batch": 8}}, "'batch' and 'batch_size' are the same option --batch-size; keep one"),
    ({"sweep": {"command": "deploy"}}, "[sweep] command must be one of the insitu training commands 'train', "
                                       "'tt train', 'lrt adapt', 'e2train run', got 'deploy'"),
    ({"sweep": {"run": "lrt.adapt"}}, "[sweep] has both run and command; keep one"),
])
def test_bad_command_sweeps_are_usage_errors(sections, message):
    with pytest.raises(UsageError) as err:
        command_config(**sections)
    assert message in str(err.value)


def test_a_command_sweep_needs_the_command_line_to_know_the_command():
    with pytest.raises(UsageError, match="needs the insitu command line"):
        parse_config({"sweep": {"command": "train", "metrics": ["accuracy"]}})


def test_a_metric_can_index_a_list_result():
    assert sweep.metric_value([{"accuracy": 0.5}, {"accuracy": 0.7}], "1.accuracy") == 0.7


def test_a_command_sweep_casts_a_repeatable_option_as_the_command_does():
    from insitu.cli.sweep import command_spec

    cast = command_spec("train").cast
    assert cast("lr-scale", "classifier=5") == ("classifier=5",)
    assert cast("lr-scale", ["classifier=5", "head.conv=2"]) == ("classifier=5", "head.conv=2")
    assert cast("lr-scale", "classifier=5,head.conv=2") == ("classifier=5", "head.conv=2")
