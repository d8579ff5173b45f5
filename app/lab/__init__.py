"""The measurement commands, apart from the server. The server never imports this package.

    bench      load against a running server (workloads, client, results files, plots)
    calibrate  fit a cost model from the real engine            uses bench's workloads
    sim        one workload through the scheduler, virtual clock uses bench, calibrate's probe
    sweep      policies × loads, each point one simulation      uses bench, sim
    steps      a server's step trace: report and replay         uses sim's cost model path

Each package's ``__init__`` exports its command; the arrows only point down that list.
"""
