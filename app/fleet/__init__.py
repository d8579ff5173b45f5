"""A local fleet: PostgreSQL, replicas and Envoy on one machine (``quanta fleet``)."""
