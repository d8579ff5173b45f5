"""``/admin/v1``: tenants, keys, quotas, usage and the audit log, behind the admin key."""
