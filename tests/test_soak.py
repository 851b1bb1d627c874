"""bench/soak.py, short: 8 clients for 8 s against the real daemon; no call may fail.

Speed and RSS are not asserted here (a shared test machine says little about either); the full
soak (`bench/soak.py`, 64 clients, 300 s) checks the RSS bound.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_soak_has_no_errors(tmp_path: Path) -> None:
    soak = _load_soak()
    code = soak.main(["--seconds", "8", "--warmup", "2", "--clients", "8", "--out", str(tmp_path), "--rss-factor", "100"])
    [report_file] = list(tmp_path.glob("soak-*.json"))
    report = json.loads(report_file.read_text())
    assert report["errors"] == 0, report["error_samples"]
    assert code == 0
    assert report["calls"] > 0 and report["daemon"]["exit_code"] == 0
    families = {method.split(".")[0] for method in report["methods"]}
    assert families >= {"sys", "episodic", "persistent", "graph", "memory"}
    assert (tmp_path / report_file.name.replace(".json", ".md")).read_text().startswith("# eurekamem soak")
