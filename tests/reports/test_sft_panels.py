"""An SFT job's report draws the curves SFT has (loss, gradient norm, ...) and no
preference or reference panels."""

from reports.panels import panels_for


def test_sft_reports_its_own_panels():
    series: dict[str, dict[str, list]] = {
        name: {"steps": [1, 2], "values": [1.0, 0.5]}
        for name in ("loss", "grad_norm", "lr", "rewards/chosen", "kl", "clamp_frac")
    }
    titles = [p.title for p, _ in panels_for(series, "sft", False)]
    assert titles[0] == "Loss" and "Gradient norm (before clipping)" in titles
    assert not any("reward" in t.lower() or "KL" in t or "clamp" in t for t in titles), titles
