"""The simulator: a cost model fitted from the real engine, a simulated executor and an event
loop that drive the very same ``Scheduler`` on a virtual clock."""
