"""The scheme search's validation by training (issue 23, item 4): each search keeps a shortlist of
distinct feasible schemes it evaluated, and short training picks the one that trains best
(eq. 5's sum of contributions only predicts it). Stand-in scorers keep these tests fast."""

import json

import numpy as np
import pytest

from insitu.errors import InsituError, UsageError
from insitu.sparse import scheme as S
from insitu.sparse.baselines import random_search
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.contributions import Bundle
from insitu.sparse.evolution import evolutionary_search
from insitu.sparse.graph import random_graph
from insitu.sparse.memory import MemoryModel, scheme_key
from insitu.sparse.objective import Candidate, distance, shortlist
from insitu.sparse.search import run_search, validate_candidates
from insitu.training import sample_order

from test_sparse_search import synthetic

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- the shortlist

def _values(n=40, genes=6, seed=0):
    rng = np.random.default_rng(seed)
    values = {}
    while len(values) < n:
        g = (int(rng.integers(1, genes + 2)), tuple(int(x) for x in rng.integers(0, 5, genes)))
        values[g] = float(rng.normal())
    return values


def test_plain_shortlist_is_the_top_by_objective():
    values = _values()
    top = shortlist(values, 5)
    assert top == sorted(values, key=lambda g: (-values[g], g))[:5]
    assert shortlist(values, 100) == sorted(values, key=lambda g: (-values[g], g))    # fewer than asked: all


def test_shortlist_keeps_candidates_apart_and_fills_up():
    values = _values(60)
    picks = shortlist(values, 6, min_distance=4)
    assert len(picks) == len(set(picks)) == 6
    assert picks[0] == max(values, key=lambda g: (values[g], tuple(-x for x in g[1])))     # the best is always in
    assert all(distance(a, b) >= 4 for i, a in enumerate(picks) for b in picks[i + 1:])
    assert [values[g] for g in picks] == sorted((values[g] for g in picks), reverse=True)
    # a distance no two genomes reach: the best, then filled up by objective
    far = shortlist(values, 6, min_distance=99)
    assert far == shortlist(values, 6)
    with pytest.raises(UsageError):
        shortlist(values, 0)


def test_distance_counts_the_bias_depth_as_a_gene():
    assert distance((3, (0, 1, 2)), (3, (0, 1, 2))) == 0
    assert distance((3, (0, 1, 2)), (4, (0, 1, 3))) == 2


@pytest.mark.parametrize("search", [evolutionary_search, random_search])
def test_searches_keep_distinct_feasible_candidates_best_first(search):
    table, memory, budget = synthetic(10, 1)
    r = search(table, memory, budget, evaluations=400, seed=3, keep=8, min_distance=3)
    assert len(r.candidates) == 8
    assert r.candidates[0].scheme == r.scheme and r.candidates[0].objective == r.objective
    keys = [scheme_key(c.scheme) for c in r.candidates]
    assert len(set(keys)) == 8
    for c in r.candidates:
        assert c.memory == memory(c.scheme) <= budget
        assert c.objective == pytest.approx(table.objective(*table.genome(c.scheme)))
        assert c.objective <= r.objective
    genomes = [table.genome(c.scheme) for c in r.candidates]
    assert all(distance(a, b) >= 3 for i, a in enumerate(genomes) for b in genomes[i + 1:])
    # keep=1 (the default) is the search as before: its best alone, the same result
    plain = search(table, memory, budget, evaluations=400, seed=3)
    assert [c.scheme for c in plain.candidates] == [plain.scheme] and plain.scheme == r.scheme
    assert json.loads(json.dumps(r.to_json()))["candidates"][0]["objective"] == r.objective


# --------------------------------------------------------------------------- validation by training

def _cands(*objectives):
    return [Candidate(S.Scheme(i + 1, {"cls": 1.0}), o, 1000 + i) for i, o in enumerate(objectives)]


def test_validation_picks_what_trains_best_not_what_is_predicted_best():
    cands = _cands(0.9, 0.5, 0.3)
    trained = {1: 0.60, 2: 0.75, 3: 0.70}                         # keyed by bias_k: a stand-in scorer
    calls = []

    def score(schemes):
        calls.append(len(schemes))
        return [trained[s.bias_k] for s in schemes]

    rows, pick = validate_candidates(cands, score)
    assert calls == [3] and pick == 1
    assert [r["accuracy"] for r in rows] == [0.60, 0.75, 0.70]
    assert [r["objective"] for r in rows] == [0.9, 0.5, 0.3]
    assert rows[pick]["scheme"] == cands[1].scheme.to_json() and rows[pick]["memory_bytes"] == 1001


def test_validation_ties_go_to_the_better_predicted():
    rows, pick = validate_candidates(_cands(0.9, 0.5), lambda schemes: [0.7, 0.7])
    assert pick == 0


def test_validation_refuses_nothing_to_train_and_a_scorer_that_drops_some():
    with pytest.raises(InsituError):
        validate_candidates([], lambda s: [])
    with pytest.raises(InsituError):
        validate_candidates(_cands(0.9, 0.5), lambda s: [0.5])


# --------------------------------------------------------------------------- run_search end to end

def _bundle(seed=3):
    from insitu.sparse.quantize import new_head

    g = new_head(random_graph(seed), 3)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(40, 1) + g.tensors[g.input].shape[1:]).astype(np.int8)
    y = (x.reshape(len(x), -1).astype(int).sum(axis=1) > 0).astype(int) + (x[:, 0, 0, 0] > 60)
    gs = calibrate_gradients(g, x[:12], y[:12])
    return Bundle(g, gs, x[:30], y[:30], x[30:], y[30:], sample_order, lr=0.05)


def test_run_search_validates_each_searchs_shortlist(tmp_path, monkeypatch):
    import insitu.sparse.search as search_mod

    bundle = _bundle()
    memory = MemoryModel(bundle.graph, bundle.grad_scales, 0.05)
    budget = memory(S.bias_only(bundle.graph, len(bundle.graph.convs)))
    seeds = []
    real = search_mod.score_schemes

    def counting(b, schemes, **kw):
        seeds.append(kw["seed"])
        return real(b, schemes, **kw)

    monkeypatch.setattr(search_mod, "score_schemes", counting)
    prepared = []

    def prepare(model, task, lr, seed):
        prepared.append(seed)
        return bundle

    r = run_search("mbv2-tiny", "digits", budget, prepare=prepare, evaluations=60, train_samples=8, eval_samples=10,
                   seed=2, analysis_seed=0, cache_dir=tmp_path, keep=3, min_distance=2)
    assert prepared == [0] and r["analysis_seed"] == 0 and r["seed"] == 2 and r["keep"] == 3
    assert r["contributions"]["path"].endswith(".json") and set(seeds) == {2}
    v = r["validation"]
    for name in ("evolutionary", "random"):
        rows = v[name]["candidates"]
        assert 1 <= len(rows) <= 3 and v[name]["validated"] == len(rows)
        assert v[name]["accuracy"] == max(row["accuracy"] for row in rows)
        assert rows[v[name]["pick"]]["accuracy"] == v[name]["accuracy"]
        assert v[name]["plain"]["accuracy"] == rows[0]["accuracy"]                  # the best predicted, trained
        assert rows[0]["scheme"] == r["searches"][name]["scheme"]
        for row in rows:
            assert row["memory_bytes"] <= budget
            assert row["predicted"] == pytest.approx(v[name]["reference_accuracy"] + row["objective"])
    # a scheme both searches shortlisted is trained once
    keys = {json.dumps(row["scheme"], sort_keys=True) for n in v for row in v[n]["candidates"]}
    assert len(seeds) == len(keys)
    best = max(v, key=lambda n: (v[n]["accuracy"], n == "evolutionary"))
    assert r["scheme_from"] == best and r["scheme"] == v[best]["scheme"]
    # random search's plain pick only; and no validation at all: the best predicted, as before
    plain = run_search("mbv2-tiny", "digits", budget, prepare=prepare, evaluations=60, train_samples=8,
                       eval_samples=10, seed=2, analysis_seed=0, cache_dir=tmp_path, keep=3, min_distance=2,
                       validate_random=False)
    assert plain["contributions"]["cached"] and plain["validation"]["random"]["validated"] == 1
    none = run_search("mbv2-tiny", "digits", budget, prepare=prepare, evaluations=60, train_samples=8,
                      eval_samples=10, seed=2, analysis_seed=0, cache_dir=tmp_path, validate=False)
    assert none["validation"] is None and none["keep"] == 1
    assert none["objective"] == max(s["objective"] for s in none["searches"].values())
    with pytest.raises(UsageError, match="keep"):
        run_search("mbv2-tiny", "digits", budget, prepare=prepare, evaluations=60, train_samples=8,
                   eval_samples=10, cache_dir=tmp_path, keep=0)


# --------------------------------------------------------------------------- per-layer learning rates

def _spy_compiles(monkeypatch, *modules):
    from insitu.sparse.compiler import compile_training

    options = []

    def spy(graph, scheme, grad_scales, opts=None, *args, **kwargs):
        options.append(opts)
        return compile_training(graph, scheme, grad_scales, opts, *args, **kwargs)

    for module in modules:
        monkeypatch.setattr(module, "compile_training", spy)
    return options


def test_run_search_trains_and_plans_with_the_factors(tmp_path, monkeypatch):
    import insitu.sparse.contributions as contributions_mod
    import insitu.sparse.memory as memory_mod

    options = _spy_compiles(monkeypatch, contributions_mod, memory_mod)
    bundle = _bundle()
    budget = MemoryModel(bundle.graph, bundle.grad_scales, 0.05)(S.bias_only(bundle.graph, 3))
    kw = dict(prepare=lambda *_: bundle, evaluations=30, train_samples=6, eval_samples=8, cache_dir=tmp_path, keep=2)
    plain = run_search("mbv2-tiny", "digits", budget, **kw)
    assert plain["lr_scale"] == {} and options and all(o.lr_scale == {} for o in options)
    del options[:]
    scaled = run_search("mbv2-tiny", "digits", budget, lr_scale={"classifier": 5}, **kw)
    assert scaled["lr_scale"] == {"classifier": 5.0}
    assert options and all(o.lr_scale == {"classifier": 5.0} for o in options)    # analysis, validation, plans
    assert not scaled["contributions"]["cached"]                                    # not the one-rate analysis
    assert scaled["contributions"]["path"] != plain["contributions"]["path"]
    assert bundle.lr_scale == {}                                                   # the prepared bundle is kept
    with pytest.raises(UsageError, match="lr scale nope=2.0: .* has no layer 'nope'"):
        run_search("mbv2-tiny", "digits", budget, lr_scale={"nope": 2}, **kw)
    with pytest.raises(UsageError, match="lr scale classifier=-1: the factor must be a positive number"):
        run_search("mbv2-tiny", "digits", budget, lr_scale={"classifier": -1},
                   **{**kw, "prepare": lambda *_: pytest.fail("prepared before the factors were checked")})


def test_run_compare_trains_every_scheme_with_the_factors(monkeypatch, insitu_cache):
    import insitu.mcu.compare as compare_mod
    import insitu.sparse.contributions as contributions_mod
    from insitu.mcu.compare import format_text, run_compare

    options = _spy_compiles(monkeypatch, compare_mod, contributions_mod)
    bundle = _bundle()
    budget = MemoryModel(bundle.graph, bundle.grad_scales, 0.05)(S.bias_only(bundle.graph, 3))
    kw = dict(prepare=lambda *_: bundle, train_samples=6, eval_samples=8, evaluations=20)
    plain = run_compare("mbv2-tiny", "digits", [budget + 64], **kw)
    assert plain["lr_scale"] == {} and all(o.lr_scale == {} for o in options)
    n = len(options)
    scaled = run_compare("mbv2-tiny", "digits", [budget + 64], lr_scale={"classifier": 5}, **kw)
    assert scaled["lr_scale"] == {"classifier": 5.0}
    assert len(options) > n and all(o.lr_scale == {"classifier": 5.0} for o in options[n:])
    assert "lr 0.05 (classifier 5x)" in format_text(scaled) and "classifier 5x" not in format_text(plain)
    full = [r for r in scaled["memory"]["rows"] if r["kind"] == "full"][0]
    assert scaled["memory"]["rows"][0]["arena_bytes"] > full["arena_bytes"] > 0
    with pytest.raises(UsageError, match="lr scale nope=2.0: .* has no layer 'nope'"):
        run_compare("mbv2-tiny", "digits", [budget], lr_scale={"nope": 2}, **kw)


def test_run_compare_trains_every_scheme_in_more_sample_orders(insitu_cache):
    from insitu.mcu.compare import METHODS, format_text, run_compare

    bundle = _bundle()
    budget = MemoryModel(bundle.graph, bundle.grad_scales, 0.05)(S.bias_only(bundle.graph, 3))
    kw = dict(prepare=lambda *_: bundle, train_samples=6, eval_samples=8, evaluations=20)
    three = run_compare("mbv2-tiny", "digits", [budget + 64], sample_seeds=(1, 0, 2, 1), **kw)
    assert three["sample_seeds"] == [0, 1, 2]                   # seed's first, each once
    alone = run_compare("mbv2-tiny", "digits", [budget + 64], seed=2, **kw)
    assert alone["sample_seeds"] == [2] and "sample orders" not in format_text(alone)
    for kind, _ in METHODS:
        m, m2 = three["rows"][0]["methods"][kind], alone["rows"][0]["methods"][kind]
        if not m["fits"]:
            continue
        assert m["accuracy"] == m["accuracy_by_seed"]["0"]
        assert m["accuracy_mean"] == pytest.approx(sum(m["accuracy_by_seed"].values()) / 3)
        if m["scheme_text"] == m2["scheme_text"]:               # (seed 2's search may pick another)
            assert m2["accuracy"] == m["accuracy_by_seed"]["2"]
    assert "accuracy in the sample orders of seeds 0, 1, 2" in format_text(three)
