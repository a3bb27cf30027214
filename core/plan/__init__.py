"""`kvcalc plan`: the cheapest deployment that serves a workload under an SLO, a search of max-rate simulations.

    space.py     the search space (GPU × TP × block × max batched tokens × KV precision × replicas), a point
                 as `kvcalc sim` options, and the `kvcalc sim` command line that rebuilds them
    evaluate.py  one point: pruned (does not fit, requests longer than the context), or its run at its own
                 load, stopped there when the SLO is lost, else its max-rate search
    execute.py   points in this process, in local worker processes, or as Ray tasks; results as they finish
    cache.py     finished points on disk, keyed by everything that decides them
    planner.py   run_plan: every point, the Pareto fronts, the chosen point
"""
