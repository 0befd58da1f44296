"""`insitu mcu compare`: tiny-training Fig. 9 (sparse update vs. bias-only, last-k layers and the
classifier alone at equal memory) and the full update's peak memory, on the small mbv2-tiny with
tiny settings; and bad input."""

import json

import pytest

from conftest import insitu_cli

pytestmark = pytest.mark.system

TINY = ("--model", "mbv2-tiny", "--dataset", "digits", "--train-size", "40", "--test-samples", "40",
        "--evaluations", "20")
KINDS = ["classifier", "bias", "last", "sparse"]
LABELS = ["last layer", "bias + last layer", "last k layers", "sparse (searched)"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Two budgets with --measure-heap: the tables on stdout, the result in --out, a --plot."""
    folder = tmp_path_factory.mktemp("compare")
    run = insitu_cli("mcu", "compare", *TINY, "--budgets", "16K,8K", "--measure-heap", "--out", folder / "result.json",
                     "--plot", folder / "fig9.png")
    assert run.returncode == 0, run.stderr
    return json.loads((folder / "result.json").read_text()), folder, run.stdout


def test_every_method_is_trained_within_each_budget(compared):
    result = compared[0]
    assert result["model"] == "mbv2-tiny" and result["task"] == "digits"
    assert result["budgets"] == [8192, 16384]                        # sorted
    assert [m["key"] for m in result["methods"]] == KINDS and [m["label"] for m in result["methods"]] == LABELS
    assert [r["budget_bytes"] for r in result["rows"]] == [8192, 16384]
    floor = result["classifier_arena_bytes"]
    assert 0 < floor <= 8192
    for row in result["rows"]:
        budget = row["budget_bytes"]
        assert list(row["methods"]) == KINDS
        for kind, label in zip(KINDS, LABELS):
            m = row["methods"][kind]
            assert m["method"] == label and m["fits"] is True and m["why"] is None, m
            assert 0.0 <= m["accuracy"] <= 1.0
            assert 0 < m["arena_bytes"] <= budget
            assert m["predicted_heap_bytes"] > m["arena_bytes"]
            assert isinstance(m["scheme"], dict) and m["scheme_text"]
        methods = row["methods"]
        assert methods["classifier"]["preset"] == "classifier" and methods["classifier"]["arena_bytes"] == floor
        assert methods["bias"]["preset"].startswith("bias-") and methods["last"]["preset"].startswith("last-")
        assert methods["sparse"]["preset"] is None
        search = methods["sparse"]["search"]
        assert search["scheme_from"] in ("evolutionary", "random") and search["contributions"]
        # the classifier always trains its weights
        for kind in KINDS:
            assert methods[kind]["scheme"]["weights"].get("classifier") == 1.0
    small, large = result["rows"]
    for kind in ("bias", "last"):                # a larger budget never fits fewer layers
        k = [int(r["methods"][kind]["preset"].split("-")[1]) for r in result["rows"]]
        assert k[0] <= k[1], kind
    # The same samples for every scheme: the classifier alone reaches the same accuracy at both budgets.
    assert small["methods"]["classifier"]["accuracy"] == large["methods"]["classifier"]["accuracy"]


def test_each_program_carries_the_boards_time_counted_on_the_twin(compared):
    """--board-time (the default): every program's training step counted on the Cortex-M7 twin;
    the same program (the classifier alone at both budgets) counts the same; training more
    layers never costs less than the classifier alone; the table shows the column."""
    result, _, text = compared
    small, large = result["rows"]
    for row in result["rows"]:
        for m in row["methods"].values():
            assert 0 < m["board_ms_per_sample"] < 1000, m
    assert small["methods"]["classifier"]["board_ms_per_sample"] == large["methods"]["classifier"]["board_ms_per_sample"]
    for m in large["methods"].values():
        assert m["board_ms_per_sample"] >= large["methods"]["classifier"]["board_ms_per_sample"]
    assert all(r["board_ms_per_sample"] > 0 for r in result["memory"]["rows"])
    assert "ms / sample" in text


def test_reported_plans_are_the_compilers_and_k_is_the_largest_that_fits(compared):
    from insitu.sparse.compiler import Options, compile_training
    from insitu.sparse.scheme import Scheme, bias_only, last_k_layers
    from insitu.mcu.board_runs import Prepared

    result = compared[0]
    # The command's default rates: lr 0.01, the classifier at 5x (its update multipliers plan a
    # few bytes apart from a one-rate program's).
    assert (result["lr"], result["lr_scale"]) == (0.01, {"classifier": 5.0})
    prep = Prepared("mbv2-tiny", "digits", "classifier", result["lr"], result["seed"],
                    lr_scale=result["lr_scale"])
    L = len(prep.graph.convs)

    def arena(scheme):
        options = Options(lr=result["lr"], lr_scale=result["lr_scale"])
        return compile_training(prep.graph, scheme, prep.grad_scales, options).arena_bytes

    for row in result["rows"]:
        budget = row["budget_bytes"]
        for kind, m in row["methods"].items():
            assert arena(Scheme.from_json(m["scheme"])) == m["arena_bytes"], (kind, budget)
        for kind, make in (("bias", bias_only), ("last", last_k_layers)):
            k = int(row["methods"][kind]["preset"].split("-")[1])
            assert all(arena(make(prep.graph, j)) > budget for j in range(k + 1, L + 1)), (kind, budget, k)


def test_memory_table_sets_the_full_update_against_the_searched_schemes(compared):
    result = compared[0]
    mem = result["memory"]
    assert mem["target_ratio"] == 7.0
    rows = mem["rows"]
    assert [r["kind"] for r in rows] == ["full-no-reorder", "full", "sparse", "sparse"]
    plain, full, *sparse = rows
    assert plain["arena_bytes"] > full["arena_bytes"]                 # reordering saves memory
    assert plain["scheme"] == full["scheme"] and plain["accuracy"] == full["accuracy"]
    assert 0.0 <= full["accuracy"] <= 1.0
    for r, row in zip(sparse, result["rows"]):
        assert r["budget_bytes"] == row["budget_bytes"] and r["scheme"] == row["methods"]["sparse"]["scheme"]
        assert r["arena_bytes"] == row["methods"]["sparse"]["arena_bytes"] <= row["budget_bytes"]
        assert r["ratio_planned_vs_full_no_reorder"] == pytest.approx(plain["arena_bytes"] / r["arena_bytes"])
        assert r["ratio_planned_vs_full_no_reorder"] > r["ratio_planned_vs_full"] > 1
    assert plain["ratio_planned_vs_full_no_reorder"] == 1.0


def test_tables_and_plot_are_written(compared):
    _, folder, text = compared
    for words in ("accuracy at equal memory", "last layer", "bias + last layer", "last k layers",
                  "sparse (searched)", "smallest heap", "full, no reorder", "sparse (searched) under 8.0 KiB:"):
        assert words in text, words
    png = (folder / "fig9.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_measured_heaps_and_their_ratios(compared):
    mem = compared[0]["memory"]
    assert mem["measured"] is True and mem["board"] == "stm32f746-disco-sim" and mem["heap_samples"] >= 1
    plain, full, *sparse = mem["rows"]
    for r in (plain, full, *sparse):
        # the firmware needs the arena and its runtime; the prediction is fitted to such measurements
        assert r["min_heap_bytes"] > r["arena_bytes"]
        assert abs(r["heap_error"]) < 0.15, r
        assert r["probes"] >= 2
    assert plain["min_heap_bytes"] > full["min_heap_bytes"]
    for r in sparse:
        assert full["min_heap_bytes"] > r["min_heap_bytes"]
        assert r["ratio_measured_vs_full_no_reorder"] == pytest.approx(plain["min_heap_bytes"] / r["min_heap_bytes"])
        assert r["ratio_measured_vs_full_no_reorder"] > r["ratio_measured_vs_full"] > 1
        assert isinstance(r["target_met"], bool)
    assert plain["target_met"] is None and full["target_met"] is None


def test_a_kind_without_a_scheme_in_the_budget_is_reported(run_cli, compared):
    """At the classifier's own plan only the classifier fits: bias-1 and last-1 are it, and a
    search of one evaluation either finds it too or reports that it found none."""
    tiny = TINY[:-1] + ("1",)                            # one evaluation per search
    classifier = compared[0]["classifier_arena_bytes"]
    run = run_cli("mcu", "compare", *tiny, "--budgets", str(classifier), "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    floor = result["classifier_arena_bytes"]
    assert floor == classifier
    # the same samples, the same training: the classifier reaches what it reached in the other run
    assert result["rows"][0]["methods"]["classifier"]["accuracy"] == \
        compared[0]["rows"][0]["methods"]["classifier"]["accuracy"]
    methods = result["rows"][0]["methods"]
    assert methods["bias"]["preset"] == "bias-1" and methods["last"]["preset"] == "last-1"
    sparse = methods["sparse"]
    if sparse["fits"]:
        assert sparse["arena_bytes"] == floor
    else:
        assert sparse["accuracy"] is None and "no scheme" in sparse["why"]
        assert [r["kind"] for r in result["memory"]["rows"]] == ["full-no-reorder", "full"]


@pytest.mark.parametrize("args,message", [
    (("--budgets", "1K"), "below what any scheme needs"),
    (("--budgets", ""), "at least one memory budget"),
    (("--budgets", "8K,,16K"), "empty item"),
    (("--budgets", "8Q"), "not a memory size"),
    (("--budgets", "8K", "--model", "no-such-model"), "--model: unknown model"),
    (("--budgets", "8K", "--dataset", "no-such-task"), "--dataset: unknown task"),
    (("--budgets", "8K", "--train-size", "0"), "--train-size must be an integer >= 1"),
    (("--budgets", "8K", "--test-samples", "-3"), "--test-samples must be an integer >= 1"),
    (("--budgets", "8K", "--test-samples", "1000000"), "--test-samples must be an integer in [1,"),
    (("--budgets", "8K", "--evaluations", "0"), "--evaluations must be an integer >= 1"),
    (("--budgets", "8K", "--workers", "0"), "--workers must be an integer >= 1"),
    (("--budgets", "8K", "--lr", "0"), "--lr must be a positive finite number"),
    (("--budgets", "8K", "--plot", "/proc/fig9.png"), "cannot write --plot /proc/fig9.png"),
    (("--budgets", "8K", "--measure-heap", "--board", "stm32f746-disco"), "not a simulated microcontroller"),
])
def test_bad_input_is_a_usage_error(run_cli, args, message):
    base = ("--model", "mbv2-tiny") if "--model" not in args else ()
    run = run_cli("mcu", "compare", *base, *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("command", ["search", "compare"])
@pytest.mark.parametrize("new, old, args, message", [
    ("--dataset", "--task", ("--task", "no-such-task"), "--dataset: unknown task 'no-such-task'"),
    ("--train-size", "--train-samples", ("--train-samples", "0"), "--train-size must be an integer >= 1"),
    ("--test-samples", "--eval-samples", ("--eval-samples", "0"), "--test-samples must be an integer >= 1"),
])
def test_older_spellings_still_work_and_help_shows_the_new_one(run_cli, command, new, old, args, message):
    help_text = run_cli("mcu", command, "--help").stdout
    assert new in help_text and old not in help_text
    budget = ("--budget", "8K") if command == "search" else ("--budgets", "8K")
    run = run_cli("mcu", command, "--model", "mbv2-tiny", *budget, *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
