"""Write-count reports (insitu.lrt.write_report): histograms, lifetime and energy on synthetic
counts, agreement with the NVM model's own report, comparisons, and bad input."""

import json
import math

import numpy as np
import pytest

from insitu.errors import UsageError
from insitu.lrt.nvm import NVMArray, NVMModel
from insitu.lrt.write_report import (PE_COUNT_MAX, Layer, compare_reports, default_technology,
                                   format_report, histogram_labels, lifetime, load_counts,
                                   load_run, plot_histograms, rebin, report_payload, run_report,
                                   write_energy_j)
from insitu.numerics import LRT_WEIGHT

pytestmark = pytest.mark.unit

#: 8 cells whose histogram is known by hand (power-of-two bins)
KNOWN = np.array([0, 0, 1, 2, 3, 5, 8, 100])


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _adapt_json(path, layers: dict, samples=200, seconds=2.0, scheme="sgd", **extra):
    """A result JSON shaped like `insitu lrt adapt --out`'s, from per-cell counts."""
    model = NVMModel()
    for name, counts in layers.items():
        arr = model.add(NVMArray(name, LRT_WEIGHT, np.zeros(np.shape(counts))))
        arr.writes[...] = counts
    rep = model.report(samples)
    doc = {"env": "control", "scheme": scheme, "samples": samples, "seconds": seconds,
           "layers": {n: {k: e[k] for k in ("cells", "max_writes_per_cell", "total_writes",
                                             "update_operations", "mean_writes_per_cell",
                                             "write_histogram")}
                      for n, e in rep["arrays"].items()},
           "nvm": rep["total"], "nvm_parameters": rep["parameters"], **extra}
    path.write_text(json.dumps(doc))
    return path


# --------------------------------------------------------------------------- the math

def test_histogram_of_known_counts():
    layer = Layer.from_counts("w", KNOWN)
    assert layer.histogram == {"edges": [0, 1, 2, 4, 8, 16, 32, 64, 128],
                               "counts": [2, 1, 2, 1, 1, 0, 0, 1]}
    assert (layer.cells, layer.total_writes, layer.max_writes, layer.written_cells) == (8, 119, 100, 6)
    assert histogram_labels(layer.histogram["edges"]) == ["0", "1", "2-3", "4-7", "8-15", "16-31",
                                                          "32-63", "64-127"]


def test_lifetime_and_energy_math():
    assert lifetime(1e6, 100, 1000) == pytest.approx(1e7)           # samples
    assert lifetime(1e6, 100, 10.0) == pytest.approx(1e5)           # seconds
    assert lifetime(1e6, 0, 1000) is None                           # never written: no wear
    assert lifetime(1e6, 5, None) is None
    assert write_energy_j(119, 8, 10.9) == pytest.approx(119 * 8 * 10.9e-12)


def test_report_figures_of_a_counts_file(tmp_path):
    run = load_run(_npz(tmp_path / "c.npz", w=KNOWN.reshape(2, 4), v=np.zeros(3, np.int32)))
    assert run.source == "counts .npz" and run.exact and run.samples is None
    r = run_report(run, samples=1000, rate=50.0, endurance=1e4)
    w = r["layers"]["w"]
    assert w["max_writes_per_cell"] == 100 and w["mean_writes_per_cell"] == pytest.approx(119 / 8)
    assert w["written_cells"] == 6 and w["endurance_used"] == pytest.approx(100 / 1e4)
    assert w["lifetime_samples"] == pytest.approx(1e4 / 100 * 1000)
    assert w["lifetime_seconds"] == pytest.approx(1e4 / 100 * 1000 / 50)
    tech = default_technology()
    assert tech.write_pj_per_bit == 10.9 and tech.endurance == 1e6 and tech.bits_per_cell == 8
    assert w["write_energy_j"] == pytest.approx(119 * 8 * 10.9e-12)
    assert w["write_energy_j_per_sample"] == pytest.approx(119 * 8 * 10.9e-12 / 1000)
    assert r["layers"]["v"]["lifetime_samples"] is None and r["layers"]["v"]["written_cells"] == 0
    total = r["total"]
    assert total["cells"] == 11 and total["total_writes"] == 119 and total["max_writes_per_cell"] == 100
    assert total["write_histogram"]["counts"] == [5, 1, 2, 1, 1, 0, 0, 1]
    assert total["lifetime_samples"] == w["lifetime_samples"]       # the worst layer's
    assert r["technology"]["source"] == {"write_pj_per_bit": "default", "endurance": "option",
                                         "bits_per_cell": "default"}
    assert r["rate_source"] == "option"


def test_without_samples_lifetime_is_unknown_and_said(tmp_path):
    r = run_report(load_run(_npz(tmp_path / "c.npz", w=KNOWN)))
    assert r["layers"]["w"]["lifetime_samples"] is None and r["layers"]["w"]["lifetime_seconds"] is None
    assert any("--samples" in note for note in r["notes"])


def test_report_agrees_with_the_nvm_models_own(tmp_path):
    """The same counts through the NVM model (what `insitu lrt adapt` reports) and through the
    write report: every shared figure is equal."""
    rng = np.random.default_rng(1)
    model = NVMModel(write_pj_per_bit=7.0, endurance=5e5)
    a = model.add(NVMArray("a", LRT_WEIGHT, np.zeros((6, 5))))
    b = model.add(NVMArray("b", LRT_WEIGHT, np.zeros(40)))
    a.apply_sequence(rng.integers(-1, 2, size=(30, 6, 5)))
    b.apply_sequence(rng.integers(-1, 2, size=(7, 40)))
    expect = model.report(samples=300)
    run = load_run(_npz(tmp_path / "c.npz", **model.write_counts()))
    got = run_report(run, samples=300, write_pj_per_bit=7.0, endurance=5e5)
    for name, mine in [*got["layers"].items(), ("total", got["total"])]:
        theirs = expect["total"] if name == "total" else expect["arrays"][name]
        for key in ("cells", "total_writes", "max_writes_per_cell", "mean_writes_per_cell",
                    "written_cells", "write_histogram", "endurance_used"):
            assert mine[key] == pytest.approx(theirs[key]) if isinstance(theirs[key], float) \
                else mine[key] == theirs[key], (name, key)
        assert mine["write_energy_j"] == pytest.approx(theirs["write_energy_j"])
        assert mine["lifetime_samples"] == pytest.approx(theirs["lifetime_samples"])


def test_run_json_alone_gives_the_same_figures_as_its_counts(tmp_path):
    counts = {"fc1": np.array([[0, 3, 1], [9, 0, 0]]), "fc2": KNOWN.reshape(4, 2)}
    path = _adapt_json(tmp_path / "run.json", counts, samples=500, seconds=5.0)
    _npz(tmp_path / "run.npz", **counts)
    from_json = run_report(load_run(path))
    from_counts = run_report(load_run(path, counts=tmp_path / "run.npz"))
    assert not from_json["exact_counts"] and from_counts["exact_counts"]
    assert from_counts["counts_file"] == str(tmp_path / "run.npz")
    for name in ("fc1", "fc2"):
        assert from_json["layers"][name] == from_counts["layers"][name]
    assert from_json["total"] == from_counts["total"]
    assert from_json["rate_samples_per_s"] == pytest.approx(100.0)
    assert from_json["layers"]["fc2"]["lifetime_seconds"] == pytest.approx(1e6 / 100 * 500 / 100)
    assert from_json["technology"]["source"]["endurance"] == "run"
    assert from_json["technology"]["bits_per_cell"] == 8


def test_run_json_may_name_its_counts_file(tmp_path):
    counts = {"fc": KNOWN}
    _npz(tmp_path / "c.npz", **counts)
    path = _adapt_json(tmp_path / "run.json", counts, counts_file="c.npz")   # beside the JSON
    assert load_run(path).exact


def test_scheme_all_file_needs_a_scheme(tmp_path):
    one = json.loads(_adapt_json(tmp_path / "a.json", {"fc": KNOWN}, scheme="sgd").read_text())
    two = json.loads(_adapt_json(tmp_path / "b.json", {"fc": KNOWN // 4}, scheme="lrt").read_text())
    path = tmp_path / "all.json"
    path.write_text(json.dumps({"env": "control", "samples": 200, "summary": [], "runs": [one, two]}))
    with pytest.raises(UsageError, match=r"several schemes \(sgd, lrt\); pick one with --scheme"):
        load_run(path)
    with pytest.raises(UsageError, match="no run of scheme 'bias'"):
        load_run(path, scheme="bias")
    assert load_run(path, scheme="lrt").layers["fc"].max_writes == 25


def test_board_run_json_with_its_counts(tmp_path):
    path = tmp_path / "board.json"
    counts = np.zeros((10, 4), int)
    counts[2, 3] = 7
    path.write_text(json.dumps({"board": "ultra96v2-sim", "algo": "lrt", "layer": "fc2",
                                "samples": 70, "seconds": 1.4, "write_counts": counts.tolist()}))
    run = load_run(path)
    assert run.label == "lrt@ultra96v2-sim" and list(run.layers) == ["fc2"] and run.exact
    r = run_report(run)
    assert r["layers"]["fc2"]["lifetime_samples"] == pytest.approx(1e6 / 7 * 70)
    assert r["rate_samples_per_s"] == pytest.approx(50.0)
    assert not any("saturate" in n for n in r["notes"])
    counts[0, 0] = PE_COUNT_MAX
    path.write_text(json.dumps({"algo": "lrt", "layer": "fc2", "write_counts": counts.tolist()}))
    assert any("saturate at 65535" in n for n in load_run(path).notes)


# --------------------------------------------------------------------------- histograms, comparisons

def test_rebin_extends_power_of_two_edges():
    h = {"edges": [0, 1, 2, 4], "counts": [5, 2, 1]}
    assert rebin(h, [0, 1, 2, 4, 8, 16]) == {"edges": [0, 1, 2, 4, 8, 16], "counts": [5, 2, 1, 0, 0]}
    assert rebin({"edges": [0, 1, 2, 4], "counts": [5, 2, 0]}, [0, 1, 2]) == \
        {"edges": [0, 1, 2], "counts": [5, 2]}
    with pytest.raises(ValueError, match="beyond"):
        rebin(h, [0, 1, 2])
    with pytest.raises(ValueError, match="power-of-two"):
        rebin({"edges": [0, 1, 3], "counts": [1, 1]}, [0, 1, 2, 4])


def test_comparison_ratios_and_common_bins(tmp_path):
    sgd = load_run(_npz(tmp_path / "sgd.npz", fc=np.array([0, 8, 8, 2]), conv=np.array([1, 0])))
    lrt = load_run(_npz(tmp_path / "lrt.npz", fc=np.array([1, 1, 2, 0])))
    payload = report_payload([sgd, lrt], samples=100)
    a, b = payload["runs"]
    assert a["layers"]["fc"]["write_histogram"]["edges"] == b["layers"]["fc"]["write_histogram"]["edges"] \
        == [0, 1, 2, 4, 8, 16]
    assert b["layers"]["fc"]["write_histogram"]["counts"] == [1, 2, 1, 0, 0]
    c = payload["comparison"]
    assert (c["numerator"], c["denominator"]) == ("sgd", "lrt")
    fc = c["layers"]["fc"]
    assert fc["max_writes_per_cell"] == pytest.approx(4.0)
    assert fc["total_writes"] == pytest.approx(18 / 4)
    assert fc["written_cells"] == pytest.approx(1.0)
    assert fc["lifetime_samples"] == pytest.approx(0.25)
    assert fc["write_energy_j"] == pytest.approx(18 / 4)
    assert fc["lifetime_seconds"] is None                           # no durations known
    assert c["layers_in_one_run_only"] == {"sgd": ["conv"]}
    assert "conv" not in c["layers"]
    assert c["total"]["max_writes_per_cell"] == pytest.approx(4.0)


def test_comparison_with_zeros_gives_none_not_inf():
    first = {"label": "a", "layers": {}, "total": dict.fromkeys(
        ("max_writes_per_cell", "mean_writes_per_cell", "total_writes", "written_cells",
         "write_energy_j", "endurance_used", "lifetime_samples", "lifetime_seconds"), 3)}
    second = {"label": "b", "layers": {}, "total": {**first["total"], "total_writes": 0,
                                                    "lifetime_samples": None}}
    c = compare_reports(first, second)
    assert c["total"]["total_writes"] is None and c["total"]["lifetime_samples"] is None
    assert c["total"]["max_writes_per_cell"] == 1.0
    json.dumps(c, allow_nan=False)


def test_comparison_times_use_one_rate(tmp_path):
    fast = load_run(_adapt_json(tmp_path / "a.json", {"fc": KNOWN}, samples=100, seconds=1.0))
    slow = load_run(_adapt_json(tmp_path / "b.json", {"fc": KNOWN // 2}, samples=100, seconds=4.0,
                                scheme="lrt"))
    a, b = report_payload([fast, slow])["runs"]
    assert a["rate_samples_per_s"] == b["rate_samples_per_s"] == pytest.approx(100.0)
    assert b["layers"]["fc"]["lifetime_seconds"] == pytest.approx(1e6 / 50 * 100 / 100)
    a, b = report_payload([fast, slow], rate=10.0)["runs"]
    assert a["rate_source"] == b["rate_source"] == "option"


def test_same_labels_get_the_file_names(tmp_path):
    one = load_run(_npz(tmp_path / "run.npz", w=KNOWN))
    two = load_run(_adapt_json(tmp_path / "run.json", {"w": KNOWN}, scheme="run"))
    payload = report_payload([one, two])
    assert [r["label"] for r in payload["runs"]] == ["run (run.npz)", "run (run.json)"]


def test_text_and_figure(tmp_path):
    sgd = load_run(_adapt_json(tmp_path / "sgd.json", {"fc": KNOWN}))
    lrt = load_run(_adapt_json(tmp_path / "lrt.json", {"fc": np.minimum(KNOWN, 1)}, scheme="lrt"))
    single = format_report(report_payload([sgd]))
    assert "max/cell" in single and "fc: 0: 2 | 1: 1 | 2-3: 2" in single and "lifetime" in single
    payload = report_payload([sgd, lrt])
    text = format_report(payload)
    assert "sgd / lrt" in text and "100x" in text and "lrt writes per cell" in text
    png = plot_histograms(payload, tmp_path / "w.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(payload, allow_nan=False)


# --------------------------------------------------------------------------- bad input

def _bad(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return path


@pytest.mark.parametrize("name,content,message", [
    ("run.json", "", "is empty"),
    ("run.json", "  \n", "is empty"),
    ("run.json", '{"scheme": "sgd", "layers": {', "is not valid JSON"),
    ("run.json", "[1, 2]", "holds a JSON list"),
    ("run.json", '{"algo": "sgd", "accuracy": 0.8}', "holds no write counts (a run of 'sgd')"),
    ("run.json", '{"layers": {}}', "has an empty 'layers' object: no write counts"),
    ("run.json", '{"layers": {"fc": {"cells": 4, "write_histogram": {"edges": [0, 1], "counts": [4]}}}}',
     "layer fc: lacks 'total_writes'"),
    ("run.json", '{"layers": {"fc": {"cells": 4, "total_writes": 0, "max_writes_per_cell": 0, '
                 '"write_histogram": {"edges": [0, 1], "counts": [3]}}}}', "do not add up"),
    ("run.json", '{"algo": "lrt", "write_counts": [[1, 2], [3]]}', "not an intact"),
    ("run.json", '{"algo": "lrt", "write_counts": [[1, -2]]}', "negative write counts"),
    ("run.npz", b"PK\x03\x04 truncated", "not a readable .npz"),
    ("run.npz", b"\x00" * 10, "not a readable .npz"),
    ("run.bin", b"\x93NUMPY garbage", "not a readable .npz"),
])
def test_bad_run_files_are_usage_errors_naming_the_file(tmp_path, name, content, message):
    path = _bad(tmp_path, name, content)
    with pytest.raises(UsageError) as info:
        load_run(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert info.value.exit_code == 2


def test_missing_files_and_bad_counts(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_run(tmp_path / "nope.json")
    with pytest.raises(UsageError, match="is a folder"):
        load_run(tmp_path)
    with pytest.raises(UsageError, match="holds no arrays"):
        load_counts(_npz(tmp_path / "empty.npz"))
    with pytest.raises(UsageError, match="not whole numbers"):
        load_counts(_npz(tmp_path / "f.npz", w=np.array([0.5, 1.0])))
    with pytest.raises(UsageError, match="has no cells"):
        load_counts(_npz(tmp_path / "z.npz", w=np.zeros(0, int)))
    np.save(tmp_path / "one.npy", KNOWN)
    with pytest.raises(UsageError, match="single .npy array"):
        load_run(tmp_path / "one.npy")
    from insitu.checkpoint import save_checkpoint
    save_checkpoint(tmp_path / "ck.npz", {"w": KNOWN}, {"done": 1})
    with pytest.raises(UsageError, match="is a checkpoint, not write counts"):
        load_run(tmp_path / "ck.npz")


def test_counts_that_do_not_belong_to_the_run(tmp_path):
    path = _adapt_json(tmp_path / "run.json", {"fc1": KNOWN, "fc2": KNOWN})
    with pytest.raises(UsageError, match="holds layers fc1, run .* layers fc1, fc2"):
        load_run(path, counts=_npz(tmp_path / "a.npz", fc1=KNOWN))
    with pytest.raises(UsageError, match="does not match run .*layer fc2 has 8 cells, 58 writes"):
        load_run(path, counts=_npz(tmp_path / "b.npz", fc1=KNOWN, fc2=KNOWN // 2))
    with pytest.raises(UsageError, match="counts file .*missing.npz does not exist"):
        load_run(path, counts=tmp_path / "missing.npz")
    with pytest.raises(UsageError, match="is a counts .npz already"):
        load_run(tmp_path / "a.npz", counts=tmp_path / "a.npz")


@pytest.mark.parametrize("kwargs,message", [
    ({"endurance": 0}, "endurance must be a positive finite number"),
    ({"endurance": math.inf}, "endurance must be a positive finite number"),
    ({"write_pj_per_bit": -1.0}, "pJ per bit"),
    ({"bits_per_cell": 0}, "bits per cell must be an integer >= 1"),
    ({"rate": 0.0}, "rate"),
    ({"samples": 0}, "samples must be an integer >= 1"),
])
def test_bad_options(tmp_path, kwargs, message):
    run = load_run(_npz(tmp_path / "c.npz", w=KNOWN))
    with pytest.raises(UsageError, match=message):
        run_report(run, **kwargs)


def test_samples_option_is_for_counts_files_alone(tmp_path):
    run = load_run(_adapt_json(tmp_path / "run.json", {"w": KNOWN}, samples=200))
    assert run_report(run, samples=200)["samples"] == 200
    with pytest.raises(UsageError, match="says it took 200 samples"):
        run_report(run, samples=300)
