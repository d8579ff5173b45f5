"""Quanta's web layer around the scheduler core: the HTTP server (``server``), the OpenAI API
(``openai``), tenants and quotas (``tenancy``), the admin API (``admin``), the database
(``db``), fleet coordination (``fleet``), the CLI, and the measurement lab (``lab``)."""
