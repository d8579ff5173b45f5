"""``/admin/ui``: the scheduler's live view, for a person holding the admin key."""
