"""tools/mutation.py's batches: a section written after re-running some modules keeps the rows
and survivor lines of the others from the section before."""

from __future__ import annotations

from tests.test_mutation_tool import load


def test_a_batch_keeps_the_rows_it_did_not_re_run() -> None:
    tool = load()
    modules = tool.configured_modules()
    first, second = modules[0], modules[1]
    before = tool.section([tool.Score(first, total=10, killed=9, survivors=["x__mutmut_1"])], "`old`")
    assert f"| `{first}` | 10 | 9 | 1 (0) |" in before
    after = tool.section([tool.Score(second, total=4, killed=4)], "`new`", before)
    assert f"| `{first}` | 10 | 9 | 1 (0) |" in after  # kept
    assert f"- `{first}` `x #1`: **not explained**" in after
    assert f"| `{second}` | 4 | 4 | 0 (0) |" in after
    assert "kept from the run before" in after
    assert after.index(f"| `{first}` |") < after.index(f"| `{second}` |")  # the configured order


def test_a_full_section_says_nothing_was_kept() -> None:
    tool = load()
    text = tool.section([tool.Score(tool.configured_modules()[0], total=1, killed=1)], "`x`")
    assert "kept from the run before" not in text and "- none" in text
