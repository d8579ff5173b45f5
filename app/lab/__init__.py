"""The measurement commands, apart from the server. The server never imports this package.

    cli          the lab's ``quanta`` commands (``quanta bench …``, calibrate, sim, sweep, steps)
    server       the one server harness: a throw-away ``quanta run``, waited for until ready
    bench        load against a running server (workloads, client, results files, plots)
    calibrate    fit a cost model from the real engine             uses bench's workloads
    sim          one workload through the scheduler, virtual clock uses bench, calibrate
    sweep        policies × loads, each point one simulation       uses bench, sim
    steps        a server's step trace: report and replay          uses sim
    measure      one part measured (``quanta bench engine|scheduler|…``)
    reliability  a server under abuse: soak, chaos, overload
    fidelity     the simulator against the real server
    horizon      the horizon policy's figures, served and simulated
    clients      guidellm and aiperf beside ``quanta bench``
    fleet, gpu   replicas behind Envoy; the benches of a lent GPU machine

``cli`` imports nothing but typer until a command runs; ``server`` needs none of the lab's
libraries (the product's tests use it). Each command package's ``__init__`` exports its
command; "uses" points only up this list.
"""
