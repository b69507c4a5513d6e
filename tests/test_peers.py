"""The summary of ``benchmarks/peers.py`` names each goal met or MISSED from the rows it is given,
and says plainly when the llama.cpp rows did not run (the benchmark itself: its smoke run)."""

from __future__ import annotations

from benchmarks.peers import NOT_FOUND, OURS, THEIRS, Side, summary


def sides(ours: dict[int, float], theirs: dict[int, float]) -> dict[tuple[str, int], Side]:
    rows = {(OURS, n): Side(OURS, n, bps, 0.1, 0.2, n, 0.5, 1.0) for n, bps in ours.items()}
    return rows | {(THEIRS, n): Side(THEIRS, n, bps, 0.1, 0.2, n, 0.5, 1.0) for n, bps in theirs.items()}


def test_each_goal_is_named_met_or_missed():
    line = summary(
        sides({1: 1000, 8: 5000, 32: 9000}, {1: 2000, 8: 4000, 32: 10000}),
        {1: 0.5, 8: 1.25, 32: 0.9},
        {"engine eager": 0.6, "engine compiled": 0.3, "llama-bench tg": 0.15},
        12.0,
        (1, 8, 32),
    )
    assert "at 8 clients 1.25x (goal > 1x): met" in line
    assert "at 32 clients 0.90x (goal > 1x): MISSED" in line
    assert "32 clients / 1 client bytes/s 9.0x (steps at the bound: 12.0x; llama-server 5.0x; goal >= 8x): met" in line
    assert "ours / llama.cpp 2.00x (goal <= 1x): MISSED" in line
    assert NOT_FOUND not in line


def test_without_llama_cpp_the_summary_says_its_rows_did_not_run():
    line = summary(sides({1: 1000, 32: 4000}, {}), {}, {"engine eager": 0.6}, 6.0, (1, 32))
    assert line.startswith(f"summary: {NOT_FOUND}; ")
    assert "4.0x (steps at the bound: 6.0x; goal >= 8x): MISSED" in line
    assert "llama.cpp (goal" not in line
