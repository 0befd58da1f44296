"""The TT report figure, drawn from small synthetic histories and checked through matplotlib's objects."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from insitu.tt.report import history_figure, plot_history  # noqa: E402


def run(variant: str, ranks_per_epoch, accuracies=None) -> dict:
    """A result record with one history entry per item of ``ranks_per_epoch`` (None: a dense run)."""
    history = []
    for i, ranks in enumerate(ranks_per_epoch):
        acc = 0.5 + 0.03 * i if accuracies is None else accuracies[i]
        history.append({"epoch": i + 1, "train_accuracy": acc + 0.01, "test_accuracy": acc,
                        "ranks": ranks})
    return {"variant": variant, "history": history}


PRUNING = [[[1, 16, 16, 16, 1], [1, 16, 1]],
           [[1, 12, 15, 9, 1], [1, 14, 1]],
           [[1, 8, 13, 5, 1], [1, 11, 1]],
           [[1, 7, 13, 4, 1], [1, 11, 1]],
           [[1, 7, 12, 4, 1], [1, 10, 1]],
           [[1, 7, 12, 4, 1], [1, 10, 1]]]


def visible_ticks(axis) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]


def texts(ax) -> str:
    return "\n".join(t.get_text() for t in ax.texts)


@pytest.fixture
def figure():
    made = []

    def draw(results):
        fig = history_figure(results)
        fig.canvas.draw()                              # let the locators place the ticks
        made.append(fig)
        return fig.axes

    yield draw
    for fig in made:
        plt.close(fig)


def assert_integer_epoch_ticks(axes):
    for ax in axes:
        ticks = visible_ticks(ax.xaxis)
        assert ticks, "no epoch ticks"
        assert all(float(t).is_integer() for t in ticks), ticks


def test_a_pruning_run_draws_its_ranks_per_epoch_on_integer_ticks(figure):
    top, bottom = figure([run("fixed-prior", PRUNING)])
    assert_integer_epoch_ticks([top, bottom])
    # Four internal ranks (three in layer 1, one in layer 2), one line each, one point per epoch.
    assert len(bottom.lines) == 4
    assert [list(line.get_xdata()) for line in bottom.lines] == [[1, 2, 3, 4, 5, 6]] * 4
    assert list(bottom.lines[0].get_ydata()) == [16, 12, 8, 7, 7, 7]
    assert list(bottom.lines[3].get_ydata()) == [16, 14, 11, 11, 10, 10]
    assert all(float(t).is_integer() for t in visible_ticks(bottom.yaxis))
    assert texts(bottom) == ""                         # nothing to explain
    assert bottom.get_legend() is not None


def test_ranks_that_never_change_are_still_drawn(figure):
    flat = [[[1, 4, 4, 4, 1], [1, 4, 1]]] * 2
    top, bottom = figure([run("float", flat)])
    assert_integer_epoch_ticks([top, bottom])
    assert len(bottom.lines) == 4 and all(set(line.get_ydata()) == {4} for line in bottom.lines)
    assert all(float(t).is_integer() for t in visible_ticks(bottom.yaxis))


def test_a_dense_run_gets_text_instead_of_an_empty_ranks_panel(figure):
    top, bottom = figure([run("dense", [None] * 3)])
    assert_integer_epoch_ticks([top, bottom])
    assert not bottom.lines
    assert "no rank history" in texts(bottom) and "dense" in texts(bottom)


def test_a_single_epoch_run_gets_one_integer_tick_and_text(figure):
    top, bottom = figure([run("fixed-prior", PRUNING[:1])])
    assert visible_ticks(bottom.xaxis) == [1]
    assert_integer_epoch_ticks([top, bottom])
    assert not bottom.lines
    assert "one epoch" in texts(bottom) and "1-16-16-16-1, 1-16-1" in texts(bottom)


def test_mixed_runs_draw_the_tt_ranks_and_name_the_dense_one(figure):
    top, bottom = figure([run("dense", [None] * 6), run("fixed-prior", PRUNING),
                          run("float", [PRUNING[0]] * 6)])
    assert_integer_epoch_ticks([top, bottom])
    assert len(top.lines) == 6                         # test and train per run
    assert len(bottom.lines) == 8
    assert "dense" in texts(bottom)
    # Colours follow the variant from panel to panel.
    assert bottom.lines[0].get_color() == top.lines[2].get_color()
    assert bottom.lines[4].get_color() == top.lines[4].get_color()


def test_histories_of_different_lengths_share_the_figure(figure):
    top, bottom = figure([run("fixed-prior", PRUNING), run("fixed", PRUNING[:1]),
                          run("float-prior", PRUNING[:2])])
    assert_integer_epoch_ticks([top, bottom])
    assert len(bottom.lines) == 8                      # the one-epoch run is named in text
    assert "fixed: ranks of one epoch only" in texts(bottom)


def test_a_run_without_epochs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="float run has no epochs"):
        plot_history([run("float", [])], tmp_path / "tt.png")
    assert not (tmp_path / "tt.png").exists()


def test_plot_history_writes_the_png(tmp_path):
    open_before = len(plt.get_fignums())
    png = plot_history([run("fixed-prior", PRUNING[:1])], tmp_path / "sub" / "tt.png")
    assert png == tmp_path / "sub" / "tt.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(plt.get_fignums()) == open_before       # the figure was closed
