"""Tenancy: API keys, quotas, the limiter, the key cache and the usage ledger."""
