"""What a BENCHMARKS.md section names as its command: the recipe, not the scratch files."""

from __future__ import annotations

from pathlib import Path

from bench.report import replace_section, shown_command


def test_the_command_drops_where_the_raw_results_were_saved() -> None:
    argv = ["--rates", "450,520", "--json", "/tmp/exp/sw.json", "--write", "BENCHMARKS.md", "--from-json=/tmp/x.json"]
    assert shown_command("python -m bench.sched_wait", argv) == (
        "python -m bench.sched_wait --rates 450,520 --write BENCHMARKS.md"
    )
    assert shown_command("bench.churn", ["--checkout", "."]) == "bench.churn --checkout ."


def test_a_section_is_replaced_between_its_markers_and_the_rest_kept(tmp_path: Path) -> None:
    p = tmp_path / "B.md"
    p.write_text("# B\n\nintro\n<!-- a:begin -->\nold\n<!-- a:end -->\nafter\n")
    replace_section(p, "a", "<!-- a:begin -->\nnew\n<!-- a:end -->\n")
    assert p.read_text() == "# B\n\nintro\n<!-- a:begin -->\nnew\n<!-- a:end -->\nafter\n"
    replace_section(p, "b", "<!-- b:begin -->\nb\n<!-- b:end -->\n")
    assert p.read_text().endswith("after\n\n<!-- b:begin -->\nb\n<!-- b:end -->\n")
