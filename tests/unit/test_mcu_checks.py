"""`insitu train --algo sparse`: every check that needs no pretraining, no data, no firmware build
and no board (:func:`insitu.mcu.board_runs.check_sparse`) comes before any of them."""

import pytest

import insitu.mcu.board_runs as runs
import insitu.mcu.qemu as qemu
import insitu.sparse.pretrain as P
import insitu.sparse.quantize as Q
import insitu.sparse.tasks as tasks
from insitu.boards import get_board
from insitu.errors import UsageError
from insitu.training import TrainConfig, prepare, train

pytestmark = pytest.mark.unit

SIM, REAL = "stm32f746-disco-sim", "stm32f746-disco"


@pytest.fixture
def no_slow_work(monkeypatch):
    """Fail the test if pretraining, data loading, the firmware build or a compilation starts."""
    def slow(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} started before the cheap checks refused the run")
        return fail

    monkeypatch.setattr(P, "pretrained", slow("the pretraining"))
    monkeypatch.setattr(P, "train_float", slow("the pretraining"))
    monkeypatch.setattr(tasks, "load_task", slow("the data loading"))
    monkeypatch.setattr(qemu, "firmware", slow("the firmware build"))
    monkeypatch.setattr(runs, "Prepared", slow("the compilation"))


def refused(**options) -> UsageError:
    config = TrainConfig(algo="sparse", samples=2, **options)
    with pytest.raises(UsageError) as err:
        train(config)
    assert err.value.exit_code == 2
    return err.value


@pytest.mark.parametrize("options, says", [
    ({"board": REAL, "port": "/dev/nonexistent"},
     ["--port /dev/nonexistent", "no such serial port", "/dev/ttyACM", "insitu mcu emulate"]),
    ({"board": REAL, "port": "/dev/null"}, ["--port /dev/null", "cannot open the serial port"]),
    ({"board": REAL}, ["--port"]),
    ({"board": SIM, "port": "/dev/nonexistent"}, ["--port /dev/nonexistent"]),
    ({"board": SIM, "scheme": "bogus"}, ["--scheme bogus", "unknown scheme"]),
    ({"board": REAL, "port": "/dev/null", "scheme": "bogus"}, ["--scheme bogus"]),
    ({"board": SIM, "scheme": '{"bias_k": 1, "weights": {"nope": 1}}'}, ["no layer 'nope'", "b7.project"]),
    ({"board": SIM, "model": "mbv2-tiny", "scheme": "last-99"}, ["--scheme last-99"]),
    ({"board": SIM, "scheme": '{"weights": {"classifier": 0.3}}'}, ["ratio 0.3"]),
    ({"board": SIM, "heap": 16384}, ["16,384 B", "does not fit any scheme"]),
    ({"board": SIM, "heap": 64 << 20}, ["at most", "--twin unix"]),
    ({"board": SIM, "heap": -5}, ["--heap"]),
    ({"board": REAL, "port": "/dev/nonexistent", "heap": 65536}, ["--heap"]),
    ({"board": REAL, "port": "/dev/null", "twin": "unix"}, ["--twin"]),
    ({"board": REAL, "port": "/dev/null", "flash_dir": "flash"}, ["--flash-dir"]),
    ({"board": SIM, "dataset": "nope"}, ["--dataset: unknown task 'nope'"]),
    ({"board": SIM, "lr_scale": ("nope=2",)}, ["--lr-scale nope=2", "no layer 'nope'", "head.conv, classifier"]),
    ({"board": SIM, "lr_scale": ("classifier=0",)}, ["--lr-scale classifier=0", "positive number"]),
    ({"board": SIM, "lr_scale": ("classifier",)}, ["--lr-scale 'classifier'", "LAYER=FACTOR"]),
], ids=["missing-port", "unopenable-port", "no-port", "missing-twin-port", "bogus-scheme",
        "bogus-scheme-real-board", "scheme-layer", "scheme-too-deep", "scheme-ratio", "heap-below-runtime",
        "heap-over-twin", "negative-heap", "heap-on-real-board", "twin-on-real-board",
        "flash-dir-on-real-board", "unknown-task", "lr-scale-layer", "lr-scale-factor", "lr-scale-no-equals"])
def test_bad_options_are_refused_before_any_slow_work(no_slow_work, options, says):
    text = str(refused(**options))
    for part in says:
        assert part in text, text


def test_a_flash_dir_that_cannot_be_a_folder_is_refused(no_slow_work, tmp_path):
    (tmp_path / "file").write_text("x")
    assert "not a folder" in str(refused(board=SIM, flash_dir=str(tmp_path / "file")))
    assert "cannot be written" in str(refused(board=SIM, flash_dir=str(tmp_path / "file" / "sub")))
    # a folder that can be created is fine, and is not created by the check
    runs.check_flash_dir(str(tmp_path / "new" / "flash"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_good_options_pass_the_checks_without_slow_work(no_slow_work):
    config = TrainConfig(algo="sparse", board=SIM, model="mbv2-28", dataset="digits", scheme="bias-6",
                         heap=200_000)
    assert runs.check_sparse(config, get_board(SIM)) == 200_000
    # model and dataset left to the algorithm's defaults, filled in by training.prepare, which
    # runs the algorithm's checks
    config, board = prepare(TrainConfig(algo="sparse", board=SIM))
    assert (config.model, config.dataset) == ("mbv2-28", "digits")
    assert runs.check_sparse(config, board) == 262144


def test_lr_scale_is_parsed_against_the_model_and_is_sparse_only(no_slow_work):
    assert runs.parse_lr_scale("mbv2-28", ()) == {}
    assert runs.parse_lr_scale("mbv2-28", ("classifier=5", "head.conv=0.5", "classifier=4")) == \
        {"classifier": 4.0, "head.conv": 0.5}
    assert runs.parse_lr_scale("mbv2-28", {"classifier": 5}) == {"classifier": 5.0}
    config = TrainConfig(algo="sparse", board=SIM, lr_scale=("classifier=5",))
    assert runs.check_sparse(*prepare(config, {"lr_scale"})) == 262144
    with pytest.raises(UsageError, match="--lr-scale does not apply to --algo sgd"):
        prepare(TrainConfig(algo="sgd", lr_scale=("classifier=5",)), {"lr_scale"})


@pytest.mark.parametrize("args", [["--lr-scale", "nope=2"], ["lr-scale=nope=2"], ["lr-scale=classifier=5,nope=2"],
                                  ["--config", "{config}"]], ids=["option", "override", "override-list", "config"])
def test_train_command_refuses_a_bad_lr_scale(no_slow_work, tmp_path, args):
    from click.testing import CliRunner

    from insitu.cli import main

    config = tmp_path / "config.toml"
    config.write_text('lr-scale = ["classifier=5", "nope=2"]\n')
    args = [a.format(config=config) for a in args]
    result = CliRunner().invoke(main, ["train", "--board", SIM, "--algo", "sparse", "--samples", "2", *args])
    assert result.exit_code == 2, result.output
    assert "--lr-scale nope=2" in result.output and "no layer 'nope'" in result.output


def test_prepared_parses_the_scheme_before_the_data_and_the_pretraining(monkeypatch):
    monkeypatch.setattr(P, "pretrained", lambda *a, **k: pytest.fail("pretrained before the scheme check"))
    monkeypatch.setattr(tasks, "load_task", lambda *a, **k: pytest.fail("data before the scheme check"))
    with pytest.raises(UsageError, match="--scheme bias-x"):
        runs.Prepared("mbv2-28", "digits", "bias-x", 0.05, 0)      # `mcu minheap --scheme bias-x`


def test_the_untrained_graph_has_the_pretrained_layers(tmp_path):
    trained = P.pretrained("mbv2-tiny", cache_dir=tmp_path, samples=64, epochs=1, verbose=False)
    skeleton = Q.untrained_graph("mbv2-tiny")
    assert [n.name for n in skeleton.nodes] == [n.name for n in trained.nodes]
    assert {k: t.shape for k, t in skeleton.tensors.items()} == {k: t.shape for k, t in trained.tensors.items()}


def test_the_default_rates_are_lr_0_01_with_the_classifier_at_5x(no_slow_work, monkeypatch):
    """docs/mcu.md "int8 (QAS) vs float SGD": the setting that trained best is the default of
    `insitu train --algo sparse` and of the mcu commands; a --lr-scale given replaces it."""
    from insitu.cli.mcu import _check_analysis

    config, _ = prepare(TrainConfig(algo="sparse", board=SIM))
    assert (config.lr, config.lr_scale) == (0.01, ("classifier=5",))
    config, _ = prepare(TrainConfig(algo="sparse", board=SIM, lr_scale=("classifier=1",)), {"lr_scale"})
    assert config.lr_scale == ("classifier=1",)
    assert _check_analysis("mbv2-28", "digits", 500, None, 100, 1, 0.01, ()) == {"classifier": 5.0}
    assert _check_analysis("mbv2-28", "digits", 500, None, 100, 1, 0.01, ("b7.project=2",)) == \
        {"b7.project": 2.0}
    # The classifier is the model's last layer, whatever an imported model calls it.
    from types import SimpleNamespace

    import insitu.sparse.model_source as source

    layers = SimpleNamespace(convs=[SimpleNamespace(name="conv1"), SimpleNamespace(name="fc")])
    monkeypatch.setattr(source, "model_untrained_graph", lambda model, num_classes=None: layers)
    assert runs.default_lr_scale("net.onnx") == {"fc": 5.0}
