"""tools/mutation.py's bookkeeping (the mutation run itself is too slow for the suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_configured_modules_exist_and_explanations_name_them() -> None:
    tool = load()
    modules = tool.configured_modules()
    assert modules and all((ROOT / m).is_file() for m in modules)
    dotted = {tool.dotted(m) for m in modules}
    for name in [*tool.EQUIVALENT, *tool.IMPORT_TIME]:
        assert name.rsplit(".", 1)[0] in dotted, name
        assert "__mutmut_" in name or name in tool.IMPORT_TIME, name


def test_names_and_scores() -> None:
    tool = load()
    assert tool.short("nriplugin.kernel.cgroup.xǁCgroupsǁmatches__mutmut_7") == "Cgroups.matches #7"
    assert tool.short("nriplugin.kernel.stats.x_field__mutmut_9") == "field #9"
    s = tool.Score("m.py", total=10, killed=8, at_import=["a"])
    assert s.counted == 9 and round(s.score, 1) == 88.9
    text = tool.section([s], "`cmd`")
    assert text.startswith("<!-- mutation:begin -->") and text.rstrip().endswith("<!-- mutation:end -->")
    assert "| `m.py` | 10 | 8 | 0 (0) | 0 | 1 | 88.9 % | 0 s |" in text
