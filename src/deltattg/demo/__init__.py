"""``deltattg demo``: the end-to-end pipeline on embedded defaults — trajectory pool, progress meter, GRPO vs
DeltaTTG from one initialization, test-time guidance, and a report with plots.

    from deltattg.regime.config import regime_config
    from deltattg.demo.pipeline import run_demo
    from deltattg.demo.report import write_report
    result = run_demo(regime_config(quick=True), "runs/demo-quick")
    write_report(result)                        # runs/demo-quick/report.md and its PNG plots

Modules: ``pipeline`` (the household regime's stages, :mod:`deltattg.regime`, chained and timed, then guidance and the
credit example), ``report`` (plots, report.md, the console table), ``cli`` (kept free of heavy imports: ``deltattg``'s
parser imports it). The settings are :mod:`deltattg.regime.config`'s.
"""
