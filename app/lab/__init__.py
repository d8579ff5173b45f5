"""The measurement commands, apart from the server: ``bench`` (load against a server),
``calibrate`` (fit a cost model from the real engine), ``sim`` and ``sweep`` (the scheduler on
the virtual clock) and ``steps`` (step traces: report and replay). The server never imports
this package."""
