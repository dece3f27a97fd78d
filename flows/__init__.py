"""Prefect flows: they order stages and choose where they run; the work lives in tasks/ and components/."""

import tasks  # noqa: F401  (Prefect's offline defaults, before any flow starts a server)
