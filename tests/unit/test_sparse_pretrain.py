"""The pretraining of the MCU models (:func:`insitu.sparse.pretrain.pretrained`): announced before
it starts, an epoch line with its loss and time, cached, and resumable from its last checkpoint
with the same weights as a run never interrupted. mbv2-tiny on a few hundred images (~1 s)."""

import numpy as np
import pytest

import insitu.sparse.models as M
import insitu.sparse.pretrain as P
from insitu.checkpoint import load_checkpoint
from insitu.sparse.tasks import pretrain_task

pytestmark = pytest.mark.unit

MODEL, SAMPLES, EPOCHS = "mbv2-tiny", 320, 3


class Stop(Exception):
    pass


def same_graph(a, b) -> None:
    assert [n.name for n in a.nodes] == [n.name for n in b.nodes]
    for x, y in zip(a.convs, b.convs):
        np.testing.assert_array_equal(x.weight, y.weight)
        np.testing.assert_array_equal(x.bias, y.bias)
        np.testing.assert_array_equal(x.w_scale, y.w_scale)
    assert {k: t.scale for k, t in a.tensors.items()} == {k: t.scale for k, t in b.tensors.items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pretrain-whole")
    epochs = []
    graph = P.pretrained(MODEL, cache_dir=folder, samples=SAMPLES, epochs=EPOCHS,
                         progress=lambda e, n, loss, s: epochs.append((e, n, loss, s)))
    return graph, epochs


def test_pretraining_says_it_happens_once_how_long_and_where(tmp_path, capsys, uninterrupted):
    _, epochs = uninterrupted
    assert [e[:2] for e in epochs] == [(1, EPOCHS), (2, EPOCHS), (3, EPOCHS)]
    assert all(np.isfinite(e[2]) and e[3] >= 0 for e in epochs)
    capsys.readouterr()
    P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=1)
    err = capsys.readouterr().err
    path = P.pretrained_path(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=1)
    first = err.splitlines()[0]
    assert "once" in first and "about" in first and str(path) in first, err
    assert "epoch 1/1: loss" in err and "s elapsed" in err, err
    assert f"cached in {path}" in err.splitlines()[-1], err
    # cached: the second call says nothing and trains nothing
    P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=1)
    assert capsys.readouterr().err == ""
    assert not P.checkpoint_path(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=1).exists()
    # verbose=False: silent
    P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES // 2, epochs=1, verbose=False)
    assert capsys.readouterr().err == ""


def test_an_interrupted_pretraining_resumes_from_its_last_epoch(tmp_path, capsys, uninterrupted):
    whole, whole_epochs = uninterrupted

    def stop_after_first(epoch, epochs, loss, seconds):
        if epoch == 1:
            raise Stop

    with pytest.raises(Stop):
        P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS, progress=stop_after_first)
    final = P.pretrained_path(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS)
    partial = P.checkpoint_path(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS)
    assert not final.exists() and partial.parent == final.parent and partial.is_file()
    _, meta = load_checkpoint(partial)
    assert meta["step"] == 5 and len(meta["losses"]) == 1           # 320 / 64 = 5 steps an epoch
    capsys.readouterr()

    def no_first_epoch(*args, **kwargs):
        raise AssertionError("the resumed pretraining started from step 0")

    seen = []
    graph = P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS,
                         progress=lambda e, n, loss, s: seen.append((e, loss)))
    err = capsys.readouterr().err
    assert "resuming the interrupted pretraining at epoch 2/3" in err, err
    assert [e for e, _ in seen] == [2, 3]
    assert [loss for _, loss in seen] == [loss for _, _, loss, _ in whole_epochs[1:]]
    same_graph(graph, whole)
    assert graph.meta["pretrain"]["epoch_losses"] == whole.meta["pretrain"]["epoch_losses"]
    assert final.is_file() and not partial.exists()                   # the checkpoint is gone


def test_a_checkpoint_of_other_settings_or_unreadable_is_not_resumed(tmp_path, capsys, uninterrupted):
    whole, _ = uninterrupted
    partial = P.checkpoint_path(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"not a checkpoint")
    graph = P.pretrained(MODEL, cache_dir=tmp_path, samples=SAMPLES, epochs=EPOCHS)
    assert "starting over" in capsys.readouterr().err
    same_graph(graph, whole)


def test_train_float_resumes_mid_epoch_bit_identically():
    x, y, *_ = pretrain_task(M.model_config(MODEL).input_size)
    x, y = x[:200], y[:200]
    kwargs = dict(epochs=2, batch_size=32, lr=0.1, seed=3)
    model = M.build_model(MODEL, seed=3)
    states = []
    losses = M.train_float(model, x, y, save=states.append, save_every_s=0, **kwargs)
    steps = [s.step for s in states]
    assert steps == list(range(1, 15)), steps          # every step (save_every_s=0), 7 an epoch
    for state in (states[3], states[6], states[9]):    # mid-epoch, at an epoch's end, mid-epoch
        again = M.build_model(MODEL, seed=99)           # overwritten by the state
        assert M.train_float(again, x, y, resume=state, **kwargs) == losses
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(again.state_dict()[k], v)


def test_the_cache_key_of_the_default_models_is_unchanged():
    # Already cached pretrained models stay valid: the key covers the same settings as before.
    assert P.pretrained_path("mbv2-28").name == "mbv2-28-d564c9eff569.npz"
    assert P.pretrained_path("mbv2-tiny").name == "mbv2-tiny-e16e72c01e05.npz"
