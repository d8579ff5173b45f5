"""Tenancy: API keys and authentication, quotas, the limiter, the usage meter and ledger."""
