"""Continuous-batching simulation over the block pool (`kvcalc sim`), and the scheduler a model runner uses.

    options.py   SimOptions: every option of `kvcalc sim`, its default and help (the CLI builds its flags)
    setup.py     SimOptions -> SimJob (workload, model, memory plan, policies, targets; its `.sim`: the SimSetup
                 of settings.py, what every run shares: pool, step-time model, SchedulerConfig); the map is there
    simulate.py  every policy of a SimJob run (here or in worker processes), summarised; max-rate searches
    run.py       one run: workload + memory policy + executor -> RunRecord
    engine.py    the loop: arrivals, plan -> executor -> apply, the record
    scheduler.py request states, queues, token budget, preemption, admission (vLLM v1 style)
    plan.py      StepPlan (the scheduler's decision for a step), StepOutcome, the Executor interface
    steptime.py  the roofline step-time model, and it as an executor
    fastforward.py  runs of decode steps at once for the step-time executor (results as step by step)
    policies.py  the MemoryPolicy interface; paged.py, paged_exact.py (the block pool), reserve.py + alloc.py
    workload.py  arrivals and lengths: traces, constructed, token ids with parallel samples
    metrics.py   latencies, SLOs, RunSummary;  search.py: the highest rate under an SLO
    hardware.py  GPUs and the memory plan;  checks.py: option checks no model object owns;  record.py: RunRecord
"""
