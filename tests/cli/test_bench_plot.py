"""`hf-paged bench --plot` without matplotlib is refused before the run (issue 36): it used to run the whole
benchmark (minutes), then print on stdout that no plot was written, and exit 0."""

from __future__ import annotations

import sys

from hf_paged.cli import main


def test_plot_without_matplotlib_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    loaded = []
    monkeypatch.setattr("hf_paged.api.loading.load_model", lambda *a, **k: loaded.append(a))
    out = tmp_path / "r.json"
    status = main(["bench", "--workload", "shared-prefix", "--out", str(out), "--plot", str(tmp_path / "r.png")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and not loaded and not out.exists()
    assert err.startswith("hf-paged: error: --plot needs matplotlib") and "hf_paged[plot]" in err
    assert len(err.splitlines()) == 1
