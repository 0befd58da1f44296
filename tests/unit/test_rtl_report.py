"""The arithmetic of `insitu rtl report`: tile counts, reduced probes, summaries, cell counts."""

import dataclasses

import pytest

from insitu.rtl import synth
from insitu.tt import hardware_report as report
from insitu.tt.pe_stream import PEConfig

pytestmark = pytest.mark.unit


def test_network_ops_cover_both_layers_forward_and_backward():
    ops = report.network_ops(64)
    assert {layer for layer, _, _ in ops} == {0, 1}
    assert {op.phase for _, op, _ in ops} == {"forward", "input-grad", "weight-grad", "factor-grad"}
    # The first layer needs no input gradient.
    assert not [op for layer, op, _ in ops if layer == 0 and op.phase == "input-grad"]
    for _, op, cfg in ops:
        assert cfg.c % 16 == 0 and cfg.kind == op.kind


@pytest.mark.parametrize("cfg", [PEConfig("PE1", 3584, 1, 16, 256), PEConfig("PE2", 448, 64, 32, 64),
                                 PEConfig("PE2", 1, 28, 16384, 16), PEConfig("PE3", 28672, 64, 16, 16)])
def test_reduced_probes_keep_the_tile_shape(cfg):
    probes = report.reduced(cfg)
    assert len(probes) == 3
    counts = [report.tiles(p) for p in probes]
    assert counts == sorted(counts) and len(set(counts)) == 3
    for p in probes:
        # Only the tile count changes: the work per tile is the op's.
        assert p.macs() * report.tiles(cfg) == cfg.macs() * report.tiles(p)
        assert (p.b, p.d) == (cfg.b, cfg.d)


def test_small_ops_are_simulated_whole():
    cfg = PEConfig("PE1", 28, 1, 256, 16)
    assert report.reduced(cfg) == [cfg]


def _row(kind, cycles, ideal, stream, out_beats=1):
    return {"kind": kind, "cycles": cycles, "ideal_cycles": ideal, "stream_cycles": stream,
            "in_beats": stream, "out_beats": out_beats,
            "bound": "mac" if ideal >= stream else "stream", "utilization": ideal / cycles}


def test_summary_and_targets():
    rows = [_row("PE1", 100, 95, 50), _row("PE2", 100, 90, 40), _row("PE2", 100, 25, 100),
            _row("PE3", 1000, 990, 200)]
    # A DRAM of 32 bytes a cycle: two beats a cycle, it limits no op as simulated; streams of
    # any width would meet it on the second PE2 op (101 beats: 50.5 cycles).
    s = report.summarize(report.with_dram(rows, 100, 3200), clock_hz=100)
    assert s["per_pe"]["PE2"]["utilization_cap_of_dram"] == pytest.approx(115 / 140.5)
    assert s["dram_bound_seconds"] == pytest.approx(s["batch_seconds"])
    assert s["per_pe"]["PE2"]["utilization"] == pytest.approx(115 / 200)
    assert s["per_pe"]["PE2"]["utilization_cap_of_streams"] == pytest.approx(115 / 190)
    assert s["per_pe"]["PE2"]["stream_bound_ops"] == 1
    assert s["cycles"] == 1300 and s["batch_seconds"] == pytest.approx(13.0)
    assert s["ratio_to_mac_bound"] == pytest.approx(1300 / 1200)
    t = report.targets({**s, "yosys_part": "xczu3eg",
                        "resources": {"LUT": 1, "DSP": 279, "BRAM18": 1}})
    assert t["pe1_pe2_utilization_ge_0.90"] is False
    assert t["within_1.5x_of_mac_bound"] is True
    assert t["batch64_le_0.09s"] is False
    assert t["xczu3eg_within_paper_table2"] is False and "xc7z020_dsp_le_200" not in t
    t = report.targets({**s, "yosys_part": "xc7z020", "resources": {"LUT": 1, "DSP": 201, "BRAM18": 1},
                        "timing": {"worst_ns": 9.0, "budget_ns": 8.0}})
    assert t["xc7z020_dsp_le_200"] is False and "xczu3eg_within_paper_table2" not in t
    assert t["xc7z020_worst_le_8ns_clock"] is False
    t = report.targets({**s, "yosys_part": "xczu3eg", "timing": {"worst_ns": 4.9, "budget_ns": 5.0}},
                       batch=1)
    assert t["xczu3eg_worst_le_5ns_clock"] is True and "batch64_le_0.09s" not in t


def test_the_dram_bounds_ops_whose_streams_outrun_it():
    """Both directions share the board's DRAM: at 16 bytes a cycle, an op streaming a beat a cycle
    each way takes twice its stream cycles however fast the PE is."""
    rows = report.with_dram([_row("PE2", 110, 100, 100, out_beats=100), _row("PE2", 100, 25, 100)],
                            clock_hz=100, dram_bytes_per_s=1600)
    assert [r["dram_cycles"] for r in rows] == [200, 101]
    s = report.summarize(rows, clock_hz=100)
    assert s["dram_bound_seconds"] == pytest.approx((200 + 101) / 100)
    assert s["batch_seconds"] == pytest.approx(210 / 100)
    per = s["per_pe"]["PE2"]
    assert per["utilization_cap_of_dram"] == pytest.approx(125 / 301)
    assert per["utilization_cap_of_streams"] == pytest.approx(125 / 200)
    assert per["dram_bound_ops"] == 2


def test_each_board_is_reported_on_its_design_at_its_clock(monkeypatch):
    """Without simulating: the same measured rows give each board's seconds at its own clock,
    utilization against its design's MAC units; boards with the same parameters share one
    simulation."""
    from insitu.accel.params import AcceleratorParams

    designs = report.board_designs()
    assert designs["ultra96v2"]["clock_hz"] == 200_000_000 and designs["zedboard"]["clock_hz"] == 125_000_000
    assert designs["ultra96v2"]["yosys_part"] == "xczu3eg" and designs["zedboard"]["yosys_part"] == "xc7z020"
    assert designs["ultra96v2"]["params"] == AcceleratorParams(pe3_batch_lanes=2)
    assert designs["zedboard"]["params"] == AcceleratorParams()
    simulated = []

    def fake_measure(batch, params):
        simulated.append(params)
        lanes = params.pe3_batch_lanes
        return [{**_row("PE1", 1000, 900, 100), "op": "x"}, {**_row("PE2", 2000, 1600, 100), "op": "y"},
                {**_row("PE3", 4000 // lanes, 3990 / lanes, 100), "op": "z"}]

    monkeypatch.setattr(report, "measure_network", fake_measure)
    rep = report.report(64, synth=False)
    assert simulated == [AcceleratorParams(pe3_batch_lanes=2), AcceleratorParams()]
    assert set(rep["boards"]) == {"ultra96v2", "zedboard"} and rep["batch"] == 64
    u96, zed = rep["boards"]["ultra96v2"], rep["boards"]["zedboard"]
    assert u96["cycles"] == 1000 + 2000 + 2000 and zed["cycles"] == 1000 + 2000 + 4000
    assert u96["batch_seconds"] == pytest.approx(5000 / 200e6)
    assert zed["batch_seconds"] == pytest.approx(7000 / 125e6)
    assert u96["mac_units"]["PE3"] == 32 and zed["mac_units"]["PE3"] == 16
    assert u96["params"]["pe3_batch_lanes"] == 2 and u96["part"].startswith("xczu3eg")
    assert "resources" not in u96 and "timing" not in u96
    assert u96["targets"]["batch64_le_0.09s"] is True
    # Both boards' DRAM: 32 bits at 1066 MT/s, 4.26 GB/s; the Ultra96-V2's clock gets fewer
    # bytes a cycle of it. The fake ops move a few beats: never DRAM-bound.
    assert u96["dram_bytes_per_s"] == zed["dram_bytes_per_s"] == pytest.approx(4.264e9)
    assert u96["ops"][0]["dram_cycles"] == pytest.approx(101 * 16 / (4.264e9 / 200e6))
    assert zed["ops"][0]["dram_cycles"] == pytest.approx(101 * 16 / (4.264e9 / 125e6))
    assert u96["dram_bound_seconds"] == pytest.approx(u96["batch_seconds"])
    assert report.report_ops(rep, "zedboard") == zed["ops"]
    assert report.report_ops({"ops": [1]}) == [1]           # a report of the earlier layout
    # Only one board asked: only its design.
    simulated.clear()
    one = report.report(1, ["zedboard"], synth=False)
    assert list(one["boards"]) == ["zedboard"] and simulated == [AcceleratorParams()]


def test_network_rows_count_mac_units_of_the_design(monkeypatch):
    """measure_network's ideal cycles divide by the MAC units of the design it simulates."""
    from insitu.accel.params import AcceleratorParams

    monkeypatch.setattr(report, "simulate_cycles", lambda configs, params: [10**9] * len(configs))
    for lanes in (1, 2):
        rows = report.measure_network(64, AcceleratorParams(pe3_batch_lanes=lanes))
        pe3 = [r for r in rows if r["kind"] == "PE3"]
        assert pe3 and all(r["ideal_cycles"] == r["macs"] / (16 * lanes) for r in pe3)


def test_resources_from_yosys_cells():
    cells = {"LUT3": 10, "LUT6": 5, "RAM32M16": 2, "FDRE": 7, "FDSE": 1, "DSP48E2": 3,
             "RAMB18E2": 2, "RAMB36E2": 4, "CARRY8": 9, "BUFG": 1}
    assert synth.resources_from_cells(cells) == {"LUT": 31, "FF": 8, "DSP": 3, "BRAM18": 10}


def test_config_dataclass_replace_is_hashable():
    cfg = PEConfig("PE2", 2, 3, 32, 4)
    assert len({cfg, dataclasses.replace(cfg)}) == 1
