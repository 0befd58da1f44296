"""ONNX models through the CLI: `insitu mcu export` of a built-in model, `insitu mcu import` of the
file, `insitu train --algo sparse --model FILE.onnx` on the Cortex-M7 twin (the same program as the
built-in model's, bit-exact with the host simulator), and the refusals that come before any slow
work: a missing or non-ONNX file (exit 2, the file named), a model too big for the heap (before
a twin starts). mbv2-tiny (its pretrained cache builds in seconds)."""

import json

import onnx
import pytest

from insitu.mcu.board_runs import Prepared
from insitu.sparse.models import model_summary
from onnx_nets import Net

pytestmark = pytest.mark.system

MODEL, TASK, SCHEME, SIM_BOARD = "mbv2-tiny", "digits", "bias-4", "stm32f746-disco-sim"


def built_in_program(scheme: str) -> Prepared:
    """What `insitu train --algo sparse --model mbv2-tiny` compiles, at the default rates (lr 0.01,
    the classifier at 5x)."""
    return Prepared(MODEL, TASK, scheme, 0.01, 0, lr_scale={"classifier": 5.0})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from conftest import insitu_cli

    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    run = insitu_cli("mcu", "export", "--model", MODEL, path, "--json", timeout=120)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert r["path"] == str(path) and path.stat().st_size == r["bytes"] and r["model"] == MODEL
    onnx.checker.check_model(onnx.load(str(path)))
    return path


def test_mcu_import_shows_the_graph_and_its_memory_on_the_board(run_cli, exported):
    run = run_cli("mcu", "import", exported, "--dataset", TASK, "--json", timeout=120)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    summary = model_summary(MODEL)
    assert (r["macs"], r["params"], r["classes"]) == (summary["macs"], summary["params"], 10)
    assert [row["name"] for row in r["layers"] if row["op"] not in ("add", "avgpool")] == \
        [row["name"] for row in summary["layers"]]
    assert r["input"]["shape"] == [1, 12, 12] and "(p - 128) / 128" in r["input"]["convention"]
    assert r["source"]["sha256"] and r["calibration"] == {"from": "the file's insitu scales"}
    built_in = built_in_program("bias-6")
    assert r["training"]["arena_bytes"] == built_in.compiled.arena_bytes
    assert r["training"]["scheme_text"] == built_in.compiled.scheme.describe()
    assert 0 < r["inference"]["arena_bytes"] < r["training"]["arena_bytes"]
    assert r["fits"] and r["training"]["fits"] and r["inference"]["fits"] and r["heap_bytes"] == 262144
    text = run_cli("mcu", "import", exported, timeout=120)
    assert text.returncode == 0, text.stderr
    for part in ("b1.dw", "depthwise", "26,024 MACs", "inference: arena", "fits", "(p - 128) / 128"):
        assert part in text.stdout, text.stdout


def test_train_sparse_on_the_cortex_m7_twin_from_an_onnx_file(run_cli, exported, tmp_path):
    run = run_cli("train", "--board", SIM_BOARD, "--algo", "sparse", "--model", exported, "--scheme", SCHEME,
                  "--samples", 10, "--test-samples", 10, "--flash-dir", tmp_path / "flash", "--json", timeout=180)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    built_in = built_in_program(SCHEME)
    assert (r["model"], r["twin"], r["samples"]) == (str(exported), "qemu", 10)
    assert r["model_id"] == built_in.compiled.model_id          # the built-in model's very program
    assert r["host_sim_agreement"] == 1.0
    assert (r["accuracy_before"], r["accuracy_after"]) == (r["host_sim_accuracy_before"], r["host_sim_accuracy_after"])


def _big(path):
    """1x24x24, three 64-channel convs: its inference fits 256 KB, its training does not."""
    n = Net(1, 24, 13, seed=0)
    x = n.relu(n.conv(n.x, 1, 64, 3, name="c1"))
    x = n.relu(n.conv(x, 64, 64, 1, pad=0, name="c2"))
    x = n.relu(n.conv(x, 64, 64, 1, pad=0, name="c3"))
    onnx.save(n.model(n.gemm(n.flatten(n.gap(x, "pool")), 64, 10, name="fc"), 10), str(path))
    return path


def test_a_model_too_big_for_the_heap_is_refused_before_flashing(run_cli, exported, tmp_path):
    big = _big(tmp_path / "big.onnx")
    report = run_cli("mcu", "import", big, "--json", timeout=120)
    assert report.returncode == 0, report.stderr
    r = json.loads(report.stdout)
    assert r["inference"]["fits"] and not r["fits"] and "does not fit" in r["training"]["why"]
    for model, heap, arena in ((big, (), r["training"]["arena_bytes"]),
                               (exported, ("--heap", 69632), built_in_program(SCHEME).compiled.arena_bytes)):
        flash = tmp_path / f"flash-{model.stem}"
        run = run_cli("train", "--board", SIM_BOARD, "--algo", "sparse", "--model", model, "--scheme", SCHEME,
                      "--samples", 5, "--flash-dir", flash, *heap, "--json", timeout=120)
        assert run.returncode == 2, run.stderr
        assert "does not fit" in run.stderr and f"planned peak {arena:,} B" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr and run.stdout == "" and not flash.exists()    # no twin, no flash


@pytest.mark.parametrize("content, says", [(None, "no such file"), (b"hello\n", "not an ONNX model")],
                         ids=["missing", "not-onnx"])
@pytest.mark.parametrize("command", [
    ("train", "--board", SIM_BOARD, "--algo", "sparse", "--samples", 2, "--model"),
    ("mcu", "search", "--budget", "64K", "--model"),
    ("mcu", "compare", "--budgets", "64K", "--model"),
    ("mcu", "minheap", "--model"),
    ("mcu", "import"),
    ("mcu", "export", "out.onnx", "--model"),
], ids=["train", "search", "compare", "minheap", "import", "export"])
def test_a_bad_model_file_is_exit_2_naming_it_before_any_work(run_cli, tmp_path, insitu_cache, command, content,
                                                              says):
    path = tmp_path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    cache = insitu_cache
    run = run_cli(*command, path, cwd=tmp_path, timeout=60)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert run.stderr.startswith("error:") and str(path) in run.stderr and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (cache / "mcu").exists()
    # Before any work: nothing pretrained, compiled or built (the test's cache stays empty), nothing
    # exported, nothing announced.
    assert list(cache.iterdir()) == [] and not (tmp_path / "out.onnx").exists()
    assert "pretrain" not in run.stderr and "building" not in run.stderr, run.stderr
