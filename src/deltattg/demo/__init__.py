"""``deltattg demo``: the end-to-end pipeline on embedded defaults — trajectory pool, progress meter, GRPO vs
DeltaTTG from one initialization, test-time guidance, and a report with plots.

    from deltattg.demo.config import demo_config
    from deltattg.demo.pipeline import run_demo
    from deltattg.demo.report import write_report
    result = run_demo(demo_config(quick=True), "runs/demo-quick")
    write_report(result)                        # runs/demo-quick/report.md and its PNG plots

Modules: ``config`` (every default, in one dataclass), ``pipeline`` (the stages), ``report`` (plots, report.md,
the console table), ``cli`` (kept free of heavy imports: ``deltattg``'s parser imports it).
"""
